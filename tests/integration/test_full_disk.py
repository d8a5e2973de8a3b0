"""An agent whose work disk fills (a real 24 MB tmpfs), over the real stack: the job that
fills it fails saying so, the node says it is full and gets no new work (a waiting job's reason
names the disk), the log spool stays whole, and once space is freed everything works again;
a job that ran throughout has every line. The test's own agent advertises 12 cores and its jobs
ask for 6 (a package only it holds), so the stack's agents take none of them."""

from pathlib import Path

from tests.agents import make_big_package, on_big_nodes, retire_node, running_agent, wait_status
from tests.conftest import RunningStack, pytorch_request, signal_file
from tests.integration.test_log_durability import check_every_line_in_order, numbered
from tests.tmpfs import small_tmpfs

NODE = "disk-1"


def test_an_agent_on_a_full_disk_takes_no_new_work_and_loses_no_line(
    stack: RunningStack, tmp_path: Path
) -> None:
    admin = stack.admin
    make_big_package(stack)
    release = signal_file()
    try:
        with (
            small_tmpfs("24m") as disk,
            running_agent(stack, NODE, disk, tmp_path / "agent.log", "--min-free-mb", "1",
                          cpus=12),
        ):  # fmt: skip
            full = f"{NODE}: no space left on {disk / NODE}"
            wait_status(stack, NODE, "ready")
            steady = admin.submit(
                on_big_nodes(numbered("steady on a filling disk", 1, 1000, 50, (500, release)))
            )
            admin.wait(steady["id"], lambda j: j["state"] == "running")

            # A trainer writes the disk full, and dies of it: its reason names the disk.
            filler = admin.submit(on_big_nodes(pytorch_request("filler", "fill_scratch.py", 1)))
            failed = admin.wait_finished(filler["id"])
            assert failed["state"] == "failed"
            assert full in failed["reason"] and "No space left on device" in failed["reason"]

            row = wait_status(stack, NODE, "disk full")
            assert row["status_reason"] == full
            later = admin.submit(on_big_nodes(pytorch_request("later", "markup.py", 1)))
            waiting = admin.wait(later["id"], lambda j: full in j["reason"])
            assert waiting["state"] == "queued", waiting
            assert all(r["node"] is None for r in waiting["replicas"])
            for segment in (disk / NODE / "log-spool").glob("*.spool"):
                assert segment.read_bytes().endswith(b"\n"), "a torn record in the spool"

            # Space is freed: the node takes work again, and the waiting job runs there.
            (blob,) = (disk / NODE / "jobs" / str(filler["id"])).rglob("blob")
            blob.unlink()
            wait_status(stack, NODE, "ready")
            ran = admin.wait_finished(later["id"])
            assert ran["state"] == "succeeded", ran["reason"]
            assert {r["node"] for r in ran["replicas"]} == {NODE}

            release.touch()
            done = admin.wait_finished(steady["id"])
            assert done["state"] == "succeeded", done["reason"]
            check_every_line_in_order(admin.logs(steady["id"]), 1, 1000)
    finally:
        release.touch()
        retire_node(stack, NODE)
