"""An exec shim that ties a trainer's life to the agent that started it.

    python -I -S deathsig.py <parent_pid> -- <argv...>

It asks Linux to send it SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG), checks that the
parent is still the one expected, and then becomes the real program with exec. The death signal
survives exec, so a trainer dies with its agent however the agent dies, SIGKILL included.

Why a shim and not `preexec_fn`: preexec_fn runs Python between fork and exec in a child of a
multi-threaded process (the agent has many threads), where a lock another thread held at fork
time can never be released. Here the prctl runs in a fresh, single-threaded interpreter.

Two limits the callers must respect:
- The signal fires when the *thread* that forked the child exits, not the whole process. The
  supervisor starts a replica's processes from that replica's own thread and keeps the thread
  until the processes have ended, so it fires only when the agent itself dies.
- It reaches the trainer only. Its children are reached through the trainer's process group
  (see workers/procrecords.py), except those that leave the group with setsid.

Run with -I -S so that nothing from the trainer's environment (PYTHONPATH, a sitecustomize) runs
in the shim; the environment itself is passed on to the real program untouched. This module
imports the standard library only, and little of it: it runs before every trainer.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# Exit codes of the shim itself, in the range shells use for "could not run it".
EXIT_USAGE = 2
EXIT_NO_DEATH_SIGNAL = 126
EXIT_CANNOT_EXEC = 127
EXIT_PARENT_GONE = 125


def command(
    argv: list[str], parent_pid: int | None = None, python: str = sys.executable
) -> list[str]:
    """The argv that runs `argv` through this shim, to die with `parent_pid` (default: us)."""
    parent = os.getpid() if parent_pid is None else parent_pid
    return [python, "-I", "-S", os.path.abspath(__file__), str(parent), "--", *argv]


def _fail(message: str, code: int) -> int:
    print(f"trainyard deathsig: {message}", file=sys.stderr, flush=True)
    return code


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        return _fail("usage: deathsig.py PARENT_PID -- PROGRAM [ARG...]", EXIT_USAGE)
    parent, argv = int(args[0]), args[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        return _fail(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}", EXIT_NO_DEATH_SIGNAL)
    if os.getppid() != parent:
        # The parent died between our fork and the prctl: the signal will never come, and
        # nobody is left to supervise the program. Do not start it.
        return _fail(f"parent {parent} is gone; not starting {argv[0]}", EXIT_PARENT_GONE)
    try:
        os.execvp(argv[0], argv)  # noqa: S606 (an argv list, never a shell: the point)
    except OSError as exc:
        return _fail(f"cannot run {argv[0]}: {exc}", EXIT_CANNOT_EXEC)
    return EXIT_CANNOT_EXEC  # not reached: exec replaced this program or raised


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
