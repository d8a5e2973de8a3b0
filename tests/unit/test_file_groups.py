"""How make test hands out test files (tests/file_groups.py)."""

from tests.file_groups import BROWSER_AND_HOST_NETWORK, group_of


def test_a_file_is_a_group_of_its_own() -> None:
    assert group_of("tests/unit/test_sandbox.py::test_x[a::b]") == "tests/unit/test_sandbox.py"
    assert (
        group_of("tests/integration/test_faults.py::test_y") == "tests/integration/test_faults.py"
    )


def test_browser_tests_and_network_changers_go_together() -> None:
    for nodeid in (
        "tests/browser/test_launch_and_watch.py::test_launch_from_the_form",
        "tests/browser/test_page_rules.py::test_the_job_page[x]",
        "tests/integration/test_cluster.py::test_a_ddp_job_spans_three_hosts",
        "tests/integration/test_stack_stop.py::test_cluster_killed_by_sigkill",
        "tests/integration/test_slurm.py::test_a_ddp_job",
        "tests/integration/test_slurm_cgroup.py::test_z",
    ):
        assert group_of(nodeid) == BROWSER_AND_HOST_NETWORK, nodeid
