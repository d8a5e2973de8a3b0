"""A job's environment reaches its trainer only after the privilege drop.

Every process that runs before the drop (the keeper's death-signal shim, `env`, bwrap, setpriv,
a container runtime, the Slurm step wrapper's children) is root or the agent's user, and is a
dynamically linked program: the loader and the C library act on variables such as LD_PRELOAD,
LD_LIBRARY_PATH, GCONV_PATH or GLIBC_TUNABLES before the program's own code runs. A job that
could put its variables in their environment could run its own code as root. So those
processes get `privileged_env()`, fixed and the agent's own, and the job's variables travel on
the process's stdin (a sealed-off memory file, NUL-separated `NAME=value`) to this shim, the
last step before the trainer, which runs as the job's uid inside the sandbox:

    python -I -S jobenv.py --chdir FOLDER -- PROGRAM [ARG...]

It reads its stdin to the end, puts /dev/null in its place, changes to FOLDER, gives SIGPIPE
and SIGXFSZ their default handling back (Python ignores them, and ignored signals survive exec;
the sandbox gives SIGTERM's back before this shim starts, so that a stop during its start
ends it) and becomes PROGRAM with exactly the job's environment. Nothing of the job's is on
any command line, so `ps` on the host shows none of its (possibly secret) values. It imports
the standard library only and runs under the trainer's own interpreter, which may be older
than the agent's: keep it plain.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

# More than any environment execve takes (the kernel's limit is a quarter of the stack, 2 MiB
# by default); what is longer is no environment.
MAX_ENV_BYTES = 8 * 1024 * 1024
# What the processes before the drop inherit from the agent: nothing a job set.
PRIVILEGED_NAMES = ("PATH", "LANG", "LC_ALL", "TZ", "HOME")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# env(1)'s codes for a program that could not be run, which callers already know.
EXIT_USAGE = 125
EXIT_CANNOT_EXEC = 127


def privileged_env(source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every process before the privilege drop: the agent's own PATH,
    locale, time zone and HOME, nothing else (never the job's)."""
    source = os.environ if source is None else source
    env = {name: source[name] for name in PRIVILEGED_NAMES if name in source}
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def command(
    argv: list[str], cwd: str | os.PathLike[str], python: str = sys.executable
) -> list[str]:
    """The argv that starts `argv` in `cwd` with the environment that comes on stdin."""
    return [python, "-I", "-S", os.path.abspath(__file__), "--chdir", str(cwd), "--", *argv]


def pack(env: Mapping[str, str]) -> bytes:
    """The job's environment as this shim reads it: `NAME=value` entries, each ended by NUL."""
    return b"".join(os.fsencode(f"{name}={value}") + b"\0" for name, value in env.items())


def unpack(data: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in data.split(b"\0"):
        if not entry:
            continue
        name, sep, value = entry.partition(b"=")
        if not sep or not name:
            raise ValueError(f"not an environment entry: {entry[:40]!r}")
        env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def stdin_for(env: Mapping[str, str]) -> int:
    """A file descriptor to give the privileged chain as stdin: a memory file holding the
    packed environment, at its start. No thread need feed it (a pipe would block at 64 KiB),
    and it is gone once the last holder closes it. The caller closes its own copy."""
    fd = os.memfd_create("trainyard-env", os.MFD_CLOEXEC)
    try:
        data = memoryview(pack(env))
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_stdin() -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ENV_BYTES:
            raise ValueError(f"the environment on stdin is over {MAX_ENV_BYTES} bytes")
        chunks.append(chunk)


def _fail(message: str, code: int) -> int:
    print(f"trainyard jobenv: {message}", file=sys.stderr, flush=True)
    return code


def main(args: list[str]) -> int:
    if len(args) < 4 or args[0] != "--chdir" or args[2] != "--":
        return _fail("usage: jobenv.py --chdir FOLDER -- PROGRAM [ARG...]", EXIT_USAGE)
    folder, argv = args[1], args[3:]
    try:
        env = unpack(_read_stdin())
    except (OSError, ValueError) as exc:
        return _fail(f"cannot read the job's environment: {exc}", EXIT_USAGE)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        os.chdir(folder)
    except OSError as exc:
        return _fail(f"cannot change to {folder}: {exc}", EXIT_USAGE)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, env)  # noqa: S606 (an argv list, never a shell)
    except OSError as exc:
        return _fail(f"cannot run {argv[0]}: {exc}", EXIT_CANNOT_EXEC)
    return EXIT_CANNOT_EXEC  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
