"""Framework images that are container images, on a real engine: Debian's podman with runc,
the trainer image built here offline (stack/trainer_image.py, once per machine), and jobs
submitted through the real console whose every instance runs in a container of its own.

What a container must keep of the sandbox's promises is checked the way the sandbox's are: the
hostile probe of test_escape runs inside one."""

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from stack import trainer_image
from tests.conftest import (
    RunningStack,
    StackClient,
    pytorch_request,
    required_here,
    wait_until,
)
from tests.integration.test_directory_identity import sign_in_through_directory, team_job
from tests.integration.test_escape import assert_reaches_nothing, run_probe
from tests.unit import test_directory, test_named_folders
from tests.unit.test_named_folders import ADA, TeamTree

pytestmark = pytest.mark.integration

DDP_IMAGE = "pytorch:2.13-container"
PS_IMAGE = "kvstore-ps:2.13-container"
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 4}
# The directory tests' slapd, and the team's folder tree (tests/unit/test_named_folders.py).
directory, team_tree = test_directory.directory, test_named_folders.team_tree


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], env=trainer_image.runtime_env(), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def containers_of(job_id: int) -> list[str]:
    """The names of the job's containers that exist now, running or not."""
    listed = podman("ps", "--all", "--format", "{{.Names}}")
    assert listed.returncode == 0, listed.stderr
    return [n for n in listed.stdout.split() if n.startswith(f"trainyard-{job_id}-")]


def register_container_image(
    stack: RunningStack, name: str, like: str, reference: str, lets_in: tuple[str, ...] = ()
) -> None:
    """An admin's copy of the starter image `like` whose trainers run in `reference` ("": the
    host's Python), letting in users' own images that start with `lets_in`."""
    lets = [f"--lets-in={prefix}" for prefix in lets_in]
    stack.stack.manage("container_image", name, "--like", like, "--reference", reference, *lets)


def retire_image(stack: RunningStack, name: str) -> None:
    """Off the New job form again (kept, not deleted: the jobs that ran on it name it), so that
    no other test on the shared stack picks it up as a default or in a menu."""
    stack.stack.manage("container_image", name, "--disable")


def trainer_image_here(what: str) -> str:
    """The trainer image built here, built now if missing (once per machine and recipe: about
    1.5 minutes the first time); `what` is skipped, or failed under CI, without podman."""
    missing = trainer_image.missing_tools()
    required_here(what, f"{', '.join(missing)} missing (make containers)" if missing else None)
    return trainer_image.ensure()


@pytest.fixture(scope="module")
def reference(stack: RunningStack) -> Iterator[str]:
    built = trainer_image_here("the container tests")
    register_container_image(stack, DDP_IMAGE, "pytorch:2.13-cpu", built)
    register_container_image(stack, PS_IMAGE, "kvstore-ps:2.13", built)
    yield built
    for name in (DDP_IMAGE, PS_IMAGE):
        retire_image(stack, name)


@pytest.fixture(scope="module")
def user(stack: RunningStack, reference: str) -> Iterator[StackClient]:
    yield stack.create_user("container-user", "container-pw", quota=QUOTA)
    stack.retire_packages("in-containers")


def in_container(request: dict[str, Any], image: str = DDP_IMAGE) -> dict[str, Any]:
    return {**request, "image": image}


def test_a_two_node_ddp_job_trains_in_containers(user: StackClient, reference: str) -> None:
    # 2 × 12 GB do not fit one 16 GB node: master and worker run on different nodes.
    request = pytorch_request("ddp in containers", "digits-ddp", 2, package="server-2c12g",
                              args=["--epochs", "2"])  # fmt: skip
    job = user.wait_finished(user.submit(in_container(request))["id"])
    assert job["state"] == "succeeded", job["reason"]
    assert len({r["node"] for r in job["replicas"]}) == 2, job["replicas"]
    lines = user.logs(job["id"])
    assert {x["role"] for x in lines} >= {"master", "worker"}
    accuracies = [float(m.group(1)) for x in lines
                  if (m := re.search(r"eval_accuracy[=: ]+([\d.]+)", x["text"]))]  # fmt: skip
    metrics = user.http.get(f"/api/v1/jobs/{job['id']}/metrics").json()
    evals = [p["value"] for p in metrics["points"] if p["name"] == "eval_accuracy"]
    assert evals or accuracies, "the job reported no eval accuracy"
    assert max(evals or accuracies) > 0.8
    assert containers_of(job["id"]) == []  # --rm, and removed by name after


def test_a_parameter_server_job_trains_in_containers(user: StackClient, reference: str) -> None:
    job = user.wait_finished(
        user.submit(
            {
                "name": "ps in containers",
                "image": PS_IMAGE,
                "program": {"script": "digits-ps", "args": ["--epochs", "1"]},
                "roles": {
                    "server": {"package": "cpu-1", "instances": 1},
                    "worker": {"package": "cpu-1", "instances": 2},
                },
                "kvstore": "dist_sync",
            }
        )["id"]
    )
    assert job["state"] == "succeeded", job["reason"]
    tags = sorted(r["tag"] for r in job["replicas"])
    assert tags == ["scheduler", "server-0", "worker-0", "worker-1"]
    workers = [x for x in user.logs(job["id"])
               if re.match(r"worker \d/2 kvstore=dist_sync servers=1", x["text"])]  # fmt: skip
    assert len(workers) == 2, workers
    assert containers_of(job["id"]) == []


def test_a_failing_trainer_fails_the_job_with_its_exit_and_leaves_no_container(
    user: StackClient, reference: str
) -> None:
    job = user.wait_finished(
        user.submit(in_container(pytorch_request("fails", "fail.py", 1)))["id"]
    )
    assert job["state"] == "failed"
    assert "(exited with code 3)" in job["reason"], job["reason"]
    texts = [x["text"] for x in user.logs(job["id"])]
    assert "RuntimeError: simulated failure in step 3" in texts
    assert containers_of(job["id"]) == []


def test_an_image_the_node_cannot_get_fails_the_job_with_the_runtimes_words(
    stack: RunningStack, user: StackClient, reference: str
) -> None:
    missing = "localhost/trainyard-no-such-image:1"
    register_container_image(stack, "missing:1", "pytorch:2.13-cpu", missing)
    try:
        job = user.wait_finished(user.submit(in_container(
            pytorch_request("no image", "fail.py", 1), "missing:1"))["id"])  # fmt: skip
    finally:
        retire_image(stack, "missing:1")
    assert job["state"] == "failed"
    assert re.search(rf"image {re.escape(missing)} not found on node-\d: \S", job["reason"]), job
    texts = [x["text"] for x in user.logs(job["id"])]
    assert any(t.startswith(f"[trainyard] pulling image {missing} on node-") for t in texts), texts


def hold_in_container(
    user: StackClient, name: str, image: str = DDP_IMAGE, **also: Any
) -> dict[str, Any]:
    """A job that steps until it is cancelled (a container sees no signal file of the test's)."""
    request = pytorch_request(name, "ticker.py", 2, args=["--stop", "/never", "--every", "0.2"])
    job = user.submit({**in_container(request, image), **also})
    user.wait(job["id"], lambda j: j["state"] == "running")
    wait_until("both ranks to tick", lambda: len(ticking(user, job["id"])) == 2)
    return job


def ticking(user: StackClient, job_id: int) -> set[tuple[str, int]]:
    return {(x["role"], x["index"]) for x in user.logs(job_id) if x["text"].startswith("tick")}


def test_cancel_leaves_no_container(user: StackClient, reference: str) -> None:
    job = hold_in_container(user, "to cancel")
    assert len(containers_of(job["id"])) == 2
    assert user.http.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
    assert user.wait_finished(job["id"])["state"] == "cancelled"
    wait_until("no container of the job", lambda: containers_of(job["id"]) == [])


def test_a_restarted_agent_takes_its_containers_over(
    stack: RunningStack, user: StackClient, reference: str
) -> None:
    job = hold_in_container(user, "through an agent restart")
    before = containers_of(job["id"])
    node = user.job(job["id"])["replicas"][0]["node"]
    stack.stack.restart(node)
    # The same containers go on: the job stays running, nothing restarts, and they still tick.
    seen = len(user.logs(job["id"]))
    wait_until("lines after the restart", lambda: len(user.logs(job["id"])) > seen + 4)
    now = user.job(job["id"])
    assert now["state"] == "running" and now["attempt"] == 0, now
    assert containers_of(job["id"]) == before
    assert user.http.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
    assert user.wait_finished(job["id"])["state"] == "cancelled"
    wait_until("no container of the job", lambda: containers_of(job["id"]) == [])


def test_an_image_a_user_brings_runs_where_the_admin_lets_it_in(
    stack: RunningStack, user: StackClient, reference: str
) -> None:
    # An image on the host's Python whose admin lets in the trainer images built here.
    register_container_image(stack, "bring:1", "pytorch:2.13-cpu", "",
                             lets_in=("localhost/trainyard-trainer",))  # fmt: skip
    try:
        refused = user.http.post(
            "/api/v1/jobs",
            json={**in_container(pytorch_request("theirs", "fail.py", 1), "bring:1"),
                  "container_image": "docker.io/library/debian:12"},
        )  # fmt: skip
        assert refused.status_code == 400
        assert refused.json()["errors"]["container_image"] == [
            "docker.io/library/debian:12 is not among the images bring:1 lets in: references "
            "starting with localhost/trainyard-trainer."
        ]
        job = hold_in_container(user, "brought", "bring:1", container_image=reference)
        assert user.job(job["id"])["container_image"] == reference
        assert len(containers_of(job["id"])) == 2  # a host image's job, in containers
        assert user.http.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
        assert user.wait_finished(job["id"])["state"] == "cancelled"
        again = user.http.get(f"/api/v1/jobs/{job['id']}/request").json()
        assert again["container_image"] == reference  # Run again runs in it too
    finally:
        retire_image(stack, "bring:1")
    wait_until("no container of the job", lambda: containers_of(job["id"]) == [])


@pytest.fixture(scope="module")
def probe(
    stack: RunningStack, reference: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    with run_probe(
        stack, tmp_path_factory.mktemp("escape-c"), "container", image=DDP_IMAGE
    ) as found:
        yield found


def test_a_container_reaches_nothing_beyond_its_job(probe: Any) -> None:
    """Every escape of the sandbox's own test, tried from inside a container."""
    assert_reaches_nothing(probe)


def test_the_image_is_the_one_built_here(reference: str) -> None:
    inspected = podman("image", "inspect", reference)
    assert inspected.returncode == 0, inspected.stderr
    (image,) = json.loads(inspected.stdout)
    assert image["Labels"]["trainyard.recipe"] == reference.rsplit(":", 1)[1]
    assert shutil.which("runc")


def points(user: StackClient, job_id: int, name: str) -> list[float]:
    metrics = user.http.get(f"/api/v1/jobs/{job_id}/metrics").json()
    return [p["value"] for p in metrics["points"] if p["name"] == name]


def test_a_container_jobs_use_is_its_containers_not_the_runtimes_client(
    user: StackClient, reference: str
) -> None:
    """The charts and the Use line measure the trainer in its container: the `podman run`
    client, which is the agent's child, idles at under 1 % and about 35 MB."""
    request = pytorch_request("measured in a container", "digits-ddp", 1, args=["--epochs", "8"])
    job = user.wait_finished(user.submit(in_container(request))["id"])
    assert job["state"] == "succeeded", job["reason"]
    cpu, memory = points(user, job["id"], "cpu_percent"), points(user, job["id"], "memory_mb")
    assert cpu and memory, "no samples of the instance"
    assert max(cpu) > 30 and max(memory) > 100, (cpu, memory)  # torch, training on its core
    assert max(cpu) <= 100 * 1.1, cpu  # a cpu-1 package: its one core's worth, no more
    (instance,) = job["usage"]["instances"]
    assert instance["cpu_seconds"] > 1 and instance["memory_peak_gb"] > 0.1, instance


def test_a_memory_hog_in_a_container_fails_out_of_memory_at_its_package(
    stack: RunningStack, user: StackClient, reference: str
) -> None:
    package = stack.add_package("in-containers", memory_gb=1)
    request = pytorch_request("hog in a container", "hog.py", 1, package=package,
                              args=["--gb", "3"])  # fmt: skip
    job = user.wait_finished(user.submit(in_container(request))["id"])
    assert job["state"] == "failed"
    assert re.match(
        rf"master on node-\d: out of memory: used 1.0 of 1 GB \(package {package}\)",
        job["reason"],
    ), job["reason"]
    texts = [x["text"] for x in user.logs(job["id"])]
    assert "taking 3 GB" in texts and not any(t.startswith("survived") for t in texts)
    assert containers_of(job["id"]) == []


def test_a_fork_bomb_in_a_container_stops_at_its_process_limit(
    stack: RunningStack, user: StackClient, reference: str
) -> None:
    package = stack.add_package("in-containers", max_processes=64)
    request = pytorch_request("bomb in a container", "forks.py", 1, package=package,
                              args=["--release", "/never"])  # fmt: skip
    job = user.submit(in_container(request))
    note = f"[trainyard] process limit of 64 reached (package {package}): forks fail from now on"
    texts = lambda: [x["text"] for x in user.logs(job["id"])]  # noqa: E731
    wait_until("the limit's note", lambda: note in texts())
    said = next(t for t in texts() if t.startswith("fork failed after"))
    # The trainer, the container's init and its children, conmon: 64 tasks, no more.
    assert int(said.split()[3]) < 64, said
    assert user.http.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
    assert user.wait_finished(job["id"])["state"] == "cancelled"
    wait_until("no container of the job", lambda: containers_of(job["id"]) == [])


def test_a_directory_persons_container_job_runs_as_them_and_reads_the_teams_data(
    stack: RunningStack, reference: str, directory: Any, team_tree: TeamTree
) -> None:
    """In a container as in the sandbox: ada (signed in through slapd) runs as uid 20001, gid
    20001 and her groups (podman --user, --group-add), reads vision's data set through its
    group, and what she writes into her results folder is hers."""
    ada = sign_in_through_directory(stack, directory, "ada", "ada-directory-pw")
    job = ada.submit({**team_job(team_tree, "ada reads vision in a container"), "image": DDP_IMAGE})
    done = ada.wait_finished(job["id"])
    lines = [line["text"] for line in ada.logs(job["id"])]
    assert done["state"] == "succeeded", (done["reason"], lines)
    assert "identity uid=20001 gid=20001 groups=[20001, 30000, 30001]" in lines
    assert "first sample says: a cat" in lines
    assert "data writable: no (Read-only file system)" in lines
    result = team_tree.results / "result-0.txt"
    assert (result.stat().st_uid, result.stat().st_gid) == ADA.ids
    assert not containers_of(job["id"])
