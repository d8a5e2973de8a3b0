"""The kvstore's keyed operations over real processes, with answers known in advance."""

import pytest

from tests.ps.launcher import KV_SCRIPT, ps_job

pytestmark = pytest.mark.integration

ROLES = ("scheduler", "server-0", "server-1", "worker-0", "worker-1")


@pytest.mark.parametrize("mode", ["dist_sync", "dist_async"])
def test_keyed_push_and_pull_split_keys_and_device_lists(mode: str) -> None:
    with ps_job(servers=2, workers=2, args=[mode], script=KV_SCRIPT) as job:
        codes = job.wait()
        assert codes == dict.fromkeys(ROLES, 0), job.dump()
        # a (12 elements) is split 6/6 over the servers; then c (3) and b (2) balance them.
        assert "sharding server-0:keys=2,params=9 server-1:keys=2,params=8" in job.dump()
        for worker in ("worker-0", "worker-1"):
            assert any(line.startswith("ok ") for line in job[worker].stdout_lines())


def test_workers_of_different_modes_stop_the_job_with_a_clear_message() -> None:
    with ps_job(servers=2, workers=2, args=["dist_sync", "dist_async"], script=KV_SCRIPT) as job:
        codes = job.wait()
        assert all(codes[role] != 0 for role in ROLES), job.dump()
        for role in ROLES:
            err = job[role].text("stderr")
            assert "every worker must create the same kvstore type" in err, job.dump()
