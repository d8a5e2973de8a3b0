"""An exec shim that ties a trainer's life to the agent that started it.

    python -I -S deathsig.py <parent_pid> [--cgroup PROCS_FILE]... [--oom-score-adj N] -- <argv...>

It asks Linux to send it SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG), checks that the
parent is still the one expected, joins the instance's cgroups (workers/cgroups.py: every
process of the instance, the sandbox's included, runs inside them from its first instruction),
gives itself the trainer's OOM score (the keeper's is the agent's, the OOM killer's last choice)
and then becomes the real program with exec. The death signal
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

Run with -I -S so that nothing from its environment (PYTHONPATH, a sitecustomize) runs in the
shim. That environment is the keeper's own, never the job's: the job's variables are set only
after the privilege drop, by workers/jobenv.py. This module imports the standard library
only, and little of it: it runs before every trainer.
"""

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# Exit codes of the shim itself, in the range shells use for "could not run it".
EXIT_USAGE = 2
EXIT_NO_DEATH_SIGNAL = 126
EXIT_CANNOT_EXEC = 127
EXIT_PARENT_GONE = 125
EXIT_NO_CGROUP = 124


def command(
    argv: list[str],
    parent_pid: int | None = None,
    python: str = sys.executable,
    cgroups: Sequence[str] = (),
    oom_score_adj: int | None = None,
) -> list[str]:
    """The argv that runs `argv` through this shim, to die with `parent_pid` (default: us),
    inside the cgroups whose cgroup.procs files are `cgroups`."""
    parent = os.getpid() if parent_pid is None else parent_pid
    options = [x for path in cgroups for x in ("--cgroup", path)]
    if oom_score_adj is not None:
        options += ["--oom-score-adj", str(oom_score_adj)]
    return [python, "-I", "-S", os.path.abspath(__file__), str(parent), *options, "--", *argv]


def _fail(message: str, code: int) -> int:
    print(f"trainyard deathsig: {message}", file=sys.stderr, flush=True)
    return code


def _options(args: list[str]) -> tuple[list[str], int | None, list[str]] | None:
    """The cgroups, the OOM score and the argv after "--"; None when malformed."""
    cgroups: list[str] = []
    score = None
    i = 0
    while i + 1 < len(args) and args[i] != "--":
        if args[i] == "--cgroup":
            cgroups.append(args[i + 1])
        elif args[i] == "--oom-score-adj" and args[i + 1].lstrip("-").isdigit():
            score = int(args[i + 1])
        else:
            return None
        i += 2
    if i >= len(args) - 1 or args[i] != "--":
        return None
    return cgroups, score, args[i + 1 :]


def _join(cgroups: list[str], score: int | None) -> str | None:
    """Join the cgroups and take the OOM score; what failed, or None."""
    for path in cgroups:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError as exc:
            return f"cannot join cgroup {path}: {exc}"
    if score is not None:
        try:
            with open("/proc/self/oom_score_adj", "w") as out:
                out.write(str(score))
        except OSError as exc:
            return f"cannot set the OOM score: {exc}"
    return None


def main(args: list[str]) -> int:
    options = _options(args[1:]) if args and args[0].isdigit() else None
    if options is None:
        return _fail(
            "usage: deathsig.py PARENT_PID [--cgroup FILE]... [--oom-score-adj N] -- PROGRAM",
            EXIT_USAGE,
        )
    parent = int(args[0])
    cgroups, score, argv = options
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        return _fail(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}", EXIT_NO_DEATH_SIGNAL)
    if os.getppid() != parent:
        # The parent died between our fork and the prctl: the signal will never come, and
        # nobody is left to supervise the program. Do not start it.
        return _fail(f"parent {parent} is gone; not starting {argv[0]}", EXIT_PARENT_GONE)
    problem = _join(cgroups, score)
    if problem is not None:
        # Never run an instance's process outside its limits.
        return _fail(f"{problem}; not starting {argv[0]}", EXIT_NO_CGROUP)
    try:
        os.execvp(argv[0], argv)  # noqa: S606 (an argv list, never a shell: the point)
    except OSError as exc:
        return _fail(f"cannot run {argv[0]}: {exc}", EXIT_CANNOT_EXEC)
    return EXIT_CANNOT_EXEC  # not reached: exec replaced this program or raised


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
