"""The agent's guardian: a tiny process that outlives the agent just long enough to clean up.

The agent starts it once, in a session of its own (a signal to the agent's process group does
not reach it), with its stdin the read end of a pipe whose write end only the agent holds. The
guardian blocks reading that pipe. The kernel closes the write end when the agent exits,
however it exits, SIGKILL included, and the guardian then reads end-of-file: it reaps every
process group the agent recorded in `<workdir>/procs` and exits.

Groups whose keeper (workers/keeper.py) still runs are spared: the keeper holds them for the
next agent, and stops them itself if none comes within its grace. So the guardian reaps what a
dead keeper left in its groups (its trainers die with it, through workers/deathsig.py; what
they started in their groups does not), and groups of an agent that ran without keepers.

    python -m workers.guardian <procs dir>

It imports nothing heavy (no torch, Celery or Redis): it must start fast and cost nothing while
it waits.
"""

import os
import subprocess
import sys
from pathlib import Path

from workers.procrecords import ProcRecords, reap_all, summary

# Where `python -m workers.guardian` finds the package, whatever the agent's working directory.
_PACKAGE_PARENT = Path(__file__).resolve().parent.parent


def start(procs_dir: Path) -> subprocess.Popen[bytes]:
    """Start the guardian of this process; keep the returned Popen (its stdin is the pipe)."""
    return subprocess.Popen(
        [sys.executable, "-m", "workers.guardian", str(procs_dir)],
        stdin=subprocess.PIPE,  # the write end stays here; no other child inherits it (CLOEXEC)
        cwd=_PACKAGE_PARENT,
        start_new_session=True,
    )


def release(guardian: subprocess.Popen[bytes], timeout: float = 2.0) -> None:
    """After a normal shutdown: close the pipe, so the guardian reaps what may be left and ends."""
    assert guardian.stdin is not None
    guardian.stdin.close()
    try:
        guardian.wait(timeout)
    except subprocess.TimeoutExpired:
        pass  # still reaping a group that is slow to die; it ends on its own


def wait_for_end_of_file() -> None:
    """Block until the agent is gone. It never writes; anything written is ignored."""
    while os.read(sys.stdin.fileno(), 4096):
        pass


def main(args: list[str]) -> int:
    if len(args) != 1:
        print("usage: python -m workers.guardian PROCS_DIR", file=sys.stderr)
        return 2
    agent = os.getppid()
    wait_for_end_of_file()
    reaped = reap_all(ProcRecords(Path(args[0])))
    if any(r.killed for r in reaped):
        print(
            f"trainyard guardian: killed {summary(reaped, f'agent {agent}, which is gone')}",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
