"""Promises of the README that no other test holds over the real stack: the TensorBoard export
read back by TensorBoard's own reader, draining a node without eviction, cancelling a job that
is still queued, and both examples (the built-in `synthetic-ddp` and the code root's
`examples/hello_ddp.py`) running to success.

Jobs are kept running by hold.py, which ends only once the test creates its release file, never
by their length; every wait is for a condition.
"""

import io
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from tests.conftest import (
    TERMINAL,
    RunningStack,
    StackClient,
    pytorch_request,
    running_stack,
    signal_file,
    wait_until,
)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_METRICS = {"cpu_percent", "memory_mb", "gpu_util_percent", "gpu_memory_mb"}


def tag_of(role: str, index: int) -> str:
    return role if role == "master" else f"{role}-{index}"


def held_request(
    name: str, release: Path, instances: int, package: str = "cpu-1"
) -> dict[str, Any]:
    """hold.py on `instances` instances of `package`, running until `release` exists."""
    args = ["--release", str(release), "--rate", "5"]
    return pytorch_request(name, "hold.py", instances, package, args)


def line_count(client: StackClient, job_id: int) -> int:
    return len(client.logs(job_id))


def node_rows(client: StackClient) -> dict[str, dict[str, Any]]:
    """The stack's live nodes. A lost one (another test's agent, killed on purpose: see
    test_node_inventory) takes no work, and stays listed as lost for good."""
    response = client.http.get("/api/v1/nodes")
    assert response.status_code == 200, response.text
    return {n["name"]: n for n in response.json()["nodes"] if n["status"] != "lost"}


def idle_nodes(client: StackClient) -> dict[str, dict[str, Any]]:
    """The nodes, once every one is ready and holds nothing: other tests share this stack, and
    what these tests assert about placement and queueing is exact only on idle nodes."""

    def idle() -> dict[str, dict[str, Any]] | None:
        rows = node_rows(client)
        ok = all(n["status"] == "ready" and not n["jobs"] for n in rows.values())
        return rows if ok else None

    rows: dict[str, dict[str, Any]] = wait_until("idle, ready nodes", idle)
    return rows


@pytest.fixture
def release() -> Iterator[Path]:
    """The file that ends every hold.py job of the test; created on the way out whatever
    happened, so that no held job outlives its test (a queued one ends as soon as it starts)."""
    path = signal_file()
    try:
        yield path
    finally:
        path.touch()


# --- 1. TensorBoard export ----------------------------------------------------------------------


def unpack_safely(data: bytes, into: Path) -> list[str]:
    """Unpack a .tar.gz after checking that every member is a plain file or folder that stays
    inside `into`; returns the member names."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        members = archive.getmembers()
        for member in members:
            path = PurePosixPath(member.name)
            assert not path.is_absolute() and ".." not in path.parts, member.name
            assert member.isfile() or member.isdir(), f"{member.name}: not a file or folder"
        archive.extractall(into, filter="data")
    return [m.name for m in members]


def test_the_tensorboard_export_holds_exactly_the_jobs_metrics(
    stack: RunningStack, tmp_path: Path
) -> None:
    admin = stack.admin
    job = admin.submit(pytorch_request("tb export", "report_metrics.py", 2))
    job_id = job["id"]
    finished = admin.wait(job_id, lambda j: j["state"] in TERMINAL and j["log_archived"])
    assert finished["state"] == "succeeded", finished["reason"]
    # Archived: every point is in the database, so the export and the API see the same points.
    points = admin.http.get(f"/api/v1/jobs/{job_id}/metrics").json()["points"]

    response = admin.http.get(f"/api/v1/jobs/{job_id}/metrics.tensorboard.tar.gz")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/gzip"
    assert "attachment" in response.headers["content-disposition"]
    names = unpack_safely(response.content, tmp_path)
    run_dir = tmp_path / f"job-{job_id}"
    events = [n for n in names if PurePosixPath(n).name.startswith("events.out.tfevents.")]
    assert len(events) == 1 and PurePosixPath(events[0]).parent.name == run_dir.name, names

    reader = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={event_accumulator.SCALARS: 0}
    )
    reader.Reload()
    scalars = {
        tag: [(e.step, e.value, e.wall_time) for e in reader.Scalars(tag)]
        for tag in reader.Tags()["scalars"]
    }

    # What the job reported through trainyard_metrics, exactly (event values are float32).
    def f32(value: float) -> float:
        return float(np.float32(value))

    for who in ("master", "worker-1"):
        assert [(s, v) for s, v, _ in scalars[f"loss/{who}"]] == [
            (0, f32(1.0)),
            (1, f32(0.5)),
            (2, f32(1 / 3)),
        ]
        assert [(s, v) for s, v, _ in scalars[f"lr/{who}"]] == [(s, f32(0.1)) for s in range(3)]
        assert [v for _, v, _ in scalars[f"total_steps/{who}"]] == [3.0]
        # The agent sampled the process tree: cpu and memory curves under system/.
        assert {f"system/cpu_percent/{who}", f"system/memory_mb/{who}"} <= set(scalars)

    # And every point of the API, each under its tag, at its step (a point without a step
    # takes its order among its tag's points), value and time: nothing more, nothing less.
    expected: dict[str, list[tuple[int, float, float]]] = {}
    for p in sorted(points, key=lambda p: p["cursor"]):
        group = "system/" if p["name"] in SYSTEM_METRICS else ""
        tag = f"{group}{p['name']}/{tag_of(p['role'], p['index'])}"
        series = expected.setdefault(tag, [])
        step = p["step"] if p.get("step") is not None else len(series)
        series.append((step, f32(p["value"]), p["ts"]))
    assert scalars == expected
    assert sum(len(s) for s in scalars.values()) == len(points)


# --- 2. Drain without eviction --------------------------------------------------------------------


def test_a_drained_node_gets_no_new_work_while_its_running_job_goes_on(
    stack: RunningStack, release: Path
) -> None:
    admin = stack.admin
    idle_nodes(admin)
    held = admin.submit(held_request("held on the drained node", release, 1))
    held = admin.wait(held["id"], lambda j: j["state"] == "running")
    (drained,) = {r["node"] for r in held["replicas"]}
    others = set(node_rows(admin)) - {drained}
    assert others, "a second node is needed to take the new work"
    try:
        response = admin.http.post(f"/api/v1/nodes/{drained}/drain", json={})
        assert response.status_code == 200, response.text
        assert response.json() == {"node": drained, "status": "draining", "evicted_jobs": []}
        row = node_rows(admin)[drained]
        assert row["status"] == "draining"
        assert held["id"] in row["jobs"], row

        # New work goes elsewhere only. (Best fit would otherwise pack it beside the held job.)
        newer = admin.submit(held_request("submitted after the drain", release, 2))
        newer = admin.wait(newer["id"], lambda j: j["state"] == "running")
        placed = {r["node"] for r in newer["replicas"]}
        assert placed and placed <= others, newer["replicas"]
        assert node_rows(admin)[drained]["status"] == "draining"

        # Running work on the draining node continues: it keeps printing, then ends by itself.
        now = admin.job(held["id"])
        assert now["state"] == "running", now
        assert [(r["node"], r["state"]) for r in now["replicas"]] == [(drained, "running")]
        seen = line_count(admin, held["id"])
        wait_until("the held job to go on printing", lambda: line_count(admin, held["id"]) > seen)
        release.touch()
        for job_id in (held["id"], newer["id"]):
            done = admin.wait_finished(job_id)
            assert done["state"] == "succeeded", done["reason"]
            assert {(r["state"], r["exit_code"]) for r in done["replicas"]} == {("succeeded", 0)}
        done = admin.job(held["id"])
        assert [r["node"] for r in done["replicas"]] == [drained]

        response = admin.http.post(f"/api/v1/nodes/{drained}/ready")
        assert response.status_code == 200, response.text
        assert response.json() == {"node": drained, "status": "ready"}
        assert node_rows(admin)[drained]["status"] == "ready"
    finally:
        # Other tests share this stack: the node goes back to service whatever happened.
        admin.http.post(f"/api/v1/nodes/{drained}/ready")


# --- 3. Cancel a queued job ---------------------------------------------------------------------


def test_a_queued_job_is_cancelled_without_ever_running_and_the_running_one_goes_on(
    stack: RunningStack, release: Path
) -> None:
    """The default quota counts queued jobs too, so a quota cannot keep a job queued (it would
    refuse it); capacity does. The blocker holds one core; the queued job asks for every core
    of both nodes (four cpu-2 instances on 2 × 4 cores), which fits once the blocker is gone,
    so it is admitted and waits."""
    admin = stack.admin
    rows = idle_nodes(admin)
    whole = sum(n["capacity"]["cpu"] for n in rows.values())
    assert whole == 8 and {n["capacity"]["cpu"] for n in rows.values()} == {4}, rows
    blocker = admin.submit(held_request("blocker", release, 1))
    blocker = admin.wait(blocker["id"], lambda j: j["state"] == "running")

    waiting = admin.submit(held_request("waits for room", release, 4, package="cpu-2"))
    assert waiting["totals"]["cpu"] == whole
    # The page says why it waits, in the README's words: what it needs, and which job's end
    # frees it (the blocker's one core, beside the one left free on its node).
    (spot,) = {r["node"] for r in blocker["replicas"]}
    why = (
        "waiting: needs a node with 2 CPU cores and 4 GB free; "
        f"{spot} frees 1 CPU core when job {blocker['id']} ends"
    )
    waiting = admin.wait(waiting["id"], lambda j: j["reason"] == why or j["state"] != "queued")
    assert (waiting["state"], waiting["reason"]) == ("queued", why), waiting
    assert waiting["queue_position"] == 1, waiting
    assert {(r["node"], r["state"]) for r in waiting["replicas"]} == {(None, "pending")}
    assert len(waiting["replicas"]) == 4

    response = admin.http.post(f"/api/v1/jobs/{waiting['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "cancelled"
    cancelled = admin.wait_finished(waiting["id"])
    assert cancelled["state"] == "cancelled" and cancelled["started"] is None, cancelled
    assert "cancelled by admin" in cancelled["reason"]
    # Never placed, never started: no replica ever had a node or an exit code.
    assert [(r["node"], r["state"], r["exit_code"]) for r in cancelled["replicas"]] == [
        (None, "stopped", None)
    ] * 4
    again = admin.http.post(f"/api/v1/jobs/{waiting['id']}/cancel")
    assert again.status_code == 409, again.text

    # Its log is complete (and empty: no process of it ever printed).
    page = admin.http.get(f"/api/v1/jobs/{waiting['id']}/logs", params={"after": 0}).json()
    assert page["complete"] is True and page["lines"] == [], page
    assert admin.logs(waiting["id"]) == []

    # The blocker never noticed: still running, still printing, then succeeds when released.
    now = admin.job(blocker["id"])
    assert now["state"] == "running" and {r["state"] for r in now["replicas"]} == {"running"}
    seen = line_count(admin, blocker["id"])
    wait_until("the blocker to go on printing", lambda: line_count(admin, blocker["id"]) > seen)
    release.touch()
    done = admin.wait_finished(blocker["id"])
    assert done["state"] == "succeeded", done["reason"]
    assert [(r["tag"], r["state"], r["exit_code"]) for r in done["replicas"]] == [
        ("master", "succeeded", 0)
    ]
    # The cancelled job stayed cancelled: freed room did not start it.
    assert admin.job(waiting["id"])["state"] == "cancelled"
    assert admin.job(waiting["id"])["replicas"] == cancelled["replicas"]


# --- 4. The examples ----------------------------------------------------------------------------

SYNTHETIC_STEP = re.compile(
    r"^step=(\d+)/(\d+) (master|worker-\d+) loss=([0-9.]+) samples_per_sec=([0-9.]+)$"
)


def test_the_builtin_synthetic_ddp_example_measures_throughput(stack: RunningStack) -> None:
    admin = stack.admin
    args = ["--steps", "30", "--batch-size", "16", "--width", "32"]
    job = admin.submit(pytorch_request("synthetic", "synthetic-ddp", 2, args=args))
    assert job["program"] == {"script": "synthetic-ddp", "args": args}
    done = admin.wait(job["id"], lambda j: j["state"] in TERMINAL and j["log_archived"])
    assert done["state"] == "succeeded", done["reason"]
    assert [(r["tag"], r["exit_code"]) for r in done["replicas"]] == [
        ("master", 0),
        ("worker-1", 0),
    ]

    printed: dict[str, list[tuple[int, str]]] = {}
    for line in admin.logs(job["id"]):
        match = SYNTHETIC_STEP.match(line["text"])
        if match:
            step, total, who, _, rate = match.groups()
            assert int(total) == 30 and who == tag_of(line["role"], line["index"]), line
            printed.setdefault(who, []).append((int(step), rate))
    # Reports every 10 steps after the 5 warm-up steps, on every rank.
    assert {who: [s for s, _ in rows] for who, rows in printed.items()} == {
        "master": [10, 20, 30],
        "worker-1": [10, 20, 30],
    }
    assert all(float(rate) > 0 for rows in printed.values() for _, rate in rows)

    # The same throughput figures went through the metrics channel, one per printed line.
    points = admin.http.get(
        f"/api/v1/jobs/{job['id']}/metrics", params={"name": "samples_per_sec"}
    ).json()["points"]
    reported: dict[str, list[tuple[int, str]]] = {}
    for p in points:
        reported.setdefault(tag_of(p["role"], p["index"]), []).append(
            (p["step"], f"{p['value']:.1f}")
        )
    assert {who: sorted(rows) for who, rows in reported.items()} == printed
    lr = admin.http.get(f"/api/v1/jobs/{job['id']}/metrics", params={"name": "lr"}).json()
    assert sorted(p["value"] for p in lr["points"]) == [0.01] * 6

    summary = admin.http.get(f"/api/v1/jobs/{job['id']}/metrics/summary").json()
    assert summary["throughput"]["workers_reporting"] == 2
    assert summary["throughput"]["global_sps"] > 0
    assert summary["progress"]["fraction"] == pytest.approx(1.0)


def test_the_code_roots_hello_ddp_example_all_reduces_the_ranks(tmp_path: Path) -> None:
    """README: scripts live under the code root (`code/` in this checkout) and are given by
    their path relative to it, e.g. `examples/hello_ddp.py`. The shared stack's code root is
    tests/fixtures/code, so this runs a stack of its own (one node) on the checkout's code/."""
    code_root = REPO_ROOT / "code"
    assert (code_root / "examples" / "hello_ddp.py").is_file()
    with running_stack(tmp_path / "stack", nodes=1, code_root=code_root) as own:
        admin = own.admin
        catalog = admin.http.get("/api/v1/catalog").json()
        assert Path(catalog["code_root"]).resolve() == code_root.resolve()
        job = admin.submit(pytorch_request("hello", "examples/hello_ddp.py", 3))
        done = admin.wait_finished(job["id"])
        assert done["state"] == "succeeded", done["reason"]
        assert [(r["tag"], r["exit_code"]) for r in done["replicas"]] == [
            ("master", 0),
            ("worker-1", 0),
            ("worker-2", 0),
        ]
        said = {
            (tag_of(x["role"], x["index"]), x["text"])
            for x in admin.logs(job["id"])
            if x["stream"] == "stdout"
        }
    # Every rank joined the group of 3 with the platform's variables, and the all-reduce of
    # the ranks gave 0 + 1 + 2 on every one of them.
    assert said == {
        ("master", "hello from rank 0/3 (master-0), master 127.0.0.1"),
        ("worker-1", "hello from rank 1/3 (worker-1), master 127.0.0.1"),
        ("worker-2", "hello from rank 2/3 (worker-2), master 127.0.0.1"),
        ("master", "sum of ranks = 3 (expected 3)"),
        ("worker-1", "sum of ranks = 3 (expected 3)"),
        ("worker-2", "sum of ranks = 3 (expected 3)"),
    }
