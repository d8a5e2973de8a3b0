"""How `make test` hands test files to its pytest processes: file by file (pytest-xdist's
--dist loadfile, so that a module's stacks start once), except that the browser tests and the
tests that add and remove network interfaces in the host's own namespace (a cluster's bridge
and its hosts' veth pairs, stack/netns.py) go to one process together, as if one file, and so
never run at the same time.

Chromium takes every address or link that comes or goes as a change of network and fails what
it is loading then with net::ERR_NETWORK_CHANGED: a job page whose log module failed to load
that way stayed "queued" while its job ran to its end (test_launch_and_watch, twice in nine
full runs, each while a cluster's namespaces were made beside it).

(xdist's own --dist loadgroup would do it with marks, but under pytest 9 the group it writes
into a test's id is lost, and the tests are handed out one by one.)
"""

from xdist.scheduler import LoadFileScheduling

CHANGES_THE_HOSTS_NETWORK = frozenset(
    {
        "tests/integration/test_cluster.py",
        "tests/integration/test_stack_stop.py",
        "tests/integration/test_slurm.py",
        "tests/integration/test_slurm_cgroup.py",
    }
)
BROWSER_AND_HOST_NETWORK = "browser tests and tests that change the host's network"


def group_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module.startswith("tests/browser/") or module in CHANGES_THE_HOSTS_NETWORK:
        return BROWSER_AND_HOST_NETWORK
    return module


class FileGroupScheduling(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)
