"""Trainers in a sandbox: each process sees only its own job.

A trainer runs under bubblewrap (`bwrap`, Flatpak's sandbox, in every distribution's packages):
- its own PID namespace: no other process of the host is visible, so no other process's
  environment or command line (the agent's Redis credentials among them) can be read;
- a new root holding, read-only, only the system (/usr, /etc, /sys and the /bin, /lib links),
  the trainer's Python environment, the trainer library and the job's code; writable, only
  the instance's own folder (also its HOME, TMPDIR and /dev/shm), the job's working folder
  (where it starts; its code bound read-only over it) and the job's checkpoint folder. The
  console's and the agent's folders, other jobs' folders (working folders included) and every
  other path of the host do not exist in there;
- a minimal /dev, plus the device nodes of the GPUs the agent gave the instance (CUDA numbers
  them 0..k-1 inside, as in a container);
- the host's network (gloo and NCCL need it); no Redis credential is in reach, so the bus
  refuses it.

Where the agent runs as root (as slurmd does), bwrap builds the sandbox with its privileges and
the trainer then runs under `setpriv` as a uid of its own: `uid_base + the console user's id`,
the same on every node, so a user's checkpoints are theirs on a shared file system and another
user's jobs cannot read them (their folders are mode 0700). Where the agent is not root, bwrap
uses an unprivileged user namespace instead and the trainer keeps the agent's uid: the
namespaces still hide everything above, but files the agent's user owns outside them are
protected by the namespaces alone. Where neither works, the node is not isolated and says so.

Signals: the supervisor stops a replica by signalling its process group, which holds bwrap's
own processes as well as the trainer. bwrap forwards no signal, and it kills the trainer when
it dies (--die-with-parent), so bwrap runs with SIGTERM ignored (coreutils `env
--ignore-signal`) and the trainer gets the default back (`env --default-signal`) just before it
starts: SIGTERM reaches the trainer alone, which keeps its grace to checkpoint. bwrap reports a
trainer killed by signal N as exit code 128 + N, as shells do (exit_code() undoes that).

Environment: nothing before the drop to the job's uid runs with the job's variables (an
LD_PRELOAD there would run as root): the chain starts with the agent's own fixed environment,
and the job's reaches workers/jobenv.py, the last step, on its stdin.

No namespace code is written here: bwrap, setpriv (util-linux) and env (coreutils) do it all.
"""

import enum
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from workers import jobenv, jobfiles, unixids
from workers.folderaccess import NamedFolder
from workers.spec import ReplicaSpec
from workers.unixids import JobUser

log = logging.getLogger(__name__)

# The last step before a trainer, which sets the job's environment (workers/jobenv.py).
JOBENV_SHIM = Path(jobenv.__file__).resolve()
# Above systemd's range for containers' users (524288-1879048191) and below 2^31, so that no
# tool that keeps a uid in a signed 32-bit integer is surprised.
DEFAULT_UID_BASE = 1_900_000_000
# What the sandbox shows of the host, read-only, when it exists there. /etc holds nothing a
# trainer may not read: files with secrets in it are readable by root alone, and the trainer
# is not root.
SYSTEM_PATHS = ("/usr", "/etc", "/sys")
# On a merged-/usr system these are links into /usr; elsewhere, folders.
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Folders every trainer on a host may read (a shared data set), separated by os.pathsep: an
# agent's --sandbox-share default, and what a Slurm step wrapper shares (workers/slurmstep.py).
SHARED_ENV = "TRAINYARD_SANDBOX_SHARED"


def shared_from_env(env: dict[str, str] | None = None) -> list[Path]:
    value = (os.environ if env is None else env).get(SHARED_ENV, "")
    return [Path(p) for p in value.split(os.pathsep) if p]


# Device nodes a process with GPUs also needs, besides its own /dev/nvidiaN.
GPU_CONTROL_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
# Inside the sandbox, /tmp is a tmpfs of its own and /dev/shm a folder of the instance's, not
# the host's shared ones.
PRIVATE_TMP = "/tmp"  # noqa: S108
PRIVATE_SHM = "/dev/shm"  # noqa: S108
# How bwrap says a process died of a signal (bash's convention), and the signals it may mean.
SIGNAL_EXIT_BASE = 128
MAX_SIGNAL = 64


class Isolation(enum.StrEnum):
    """How a node's trainers are held apart, as its heartbeat says and the Nodes page shows."""

    SANDBOX = "sandbox"  # own namespaces and a uid of their own (agent is root)
    SANDBOX_SHARED_UID = "sandbox-shared-uid"  # own namespaces, the agent's uid
    NONE = "none"  # not isolated: a trainer can read what the agent can

    @property
    def isolated(self) -> bool:
        return self is not Isolation.NONE


@dataclass(frozen=True)
class Folders:
    """What one process of an instance may reach on the host, besides the system."""

    cwd: Path
    read_only: list[Path] = field(default_factory=list)
    writable: list[Path] = field(default_factory=list)
    gpu_ids: list[int] = field(default_factory=list)
    # Bound at /tmp, /dev/shm, and the process's HOME: the instance's own.
    scratch: Path | None = None
    # Folders the job named by path (workers/folderaccess.py), checked as its user already.
    named: tuple[NamedFolder, ...] = ()


@dataclass(frozen=True)
class Sandbox:
    isolation: Isolation
    bwrap: str = ""
    setpriv: str = ""
    env: str = ""
    uid_base: int = DEFAULT_UID_BASE
    reason: str = ""  # why the node is not isolated, or how it is
    # Folders every trainer of this node may read (a shared data set), as the admin chose.
    shared: tuple[Path, ...] = ()

    @property
    def switches_uid(self) -> bool:
        return self.isolation is Isolation.SANDBOX

    def uid_of(self, owner: int) -> int:
        """The uid of Trainyard's own a console user's trainers run as on every node where the
        console knows no Unix identity of theirs."""
        return self.uid_base + owner

    def user_of(
        self, owner: int, uid: int = -1, gid: int = -1, groups: Iterable[int] = ()
    ) -> JobUser:
        """Who a console user's trainers run as where this agent gives uids: their own Unix
        identity where the console sent one (uid >= 0), else a uid of Trainyard's own."""
        if uid >= 0:
            return unixids.own_user(uid, gid, tuple(groups))
        return unixids.synthetic_user(self.uid_base, owner)

    def user_for(self, spec: ReplicaSpec) -> JobUser:
        return self.user_of(spec.owner, spec.run_uid, spec.run_gid, spec.run_groups)

    def file_owner(self, user: JobUser, container: bool = False) -> int:
        """The uid that owns what a console user's trainers write on this node: theirs where
        this agent gives uids (a root agent gives its containers the user's uid even
        unsandboxed: container_user), else the agent's (trainers then run as the agent)."""
        if self.switches_uid or (container and os.geteuid() == 0):
            return user.uid
        return os.geteuid()

    def container_user(self, user: JobUser) -> JobUser | None:
        """Who a job's containers run as: the user where this agent gives uids (root), else
        None (the image's own user)."""
        return user if os.geteuid() == 0 else None

    def hand_over(self, path: Path, user: JobUser) -> None:
        """Make a folder the trainer writes to its own, and nobody else's (0700). A root agent
        gives it to the user even unsandboxed: its containers run as them."""
        ids = user.ids if self.switches_uid or os.geteuid() == 0 else None
        jobfiles.hand_over_folder(path, ids)

    def wrap(
        self, argv: list[str], folders: Folders, env: dict[str, str], user: JobUser
    ) -> tuple[list[str], dict[str, str]]:
        """The argv that runs `argv` in this sandbox, starting in `cwd`, and the environment
        it is to have. The argv must be started with jobenv.privileged_env() and that
        environment on its stdin (jobenv.stdin_for): every process before the drop to the
        job's uid has an environment of the agent's, and the job's is set by the last step
        (workers/jobenv.py), as the job's uid. Unsandboxed, the same shim sets it."""
        shim_python = _shim_python(argv[0])
        if not self.isolation.isolated:
            return jobenv.command(argv, folders.cwd, shim_python), dict(env)
        env = dict(env)
        inside: list[str] = []
        if folders.scratch is not None:
            env["HOME"] = str(folders.scratch)
            # On disk, and the instance's own: /tmp in here is a small tmpfs.
            env["TMPDIR"] = str(folders.scratch / "tmp")
        if folders.gpu_ids:
            # Only the instance's own GPUs exist in here, and CUDA numbers them from 0.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(folders.gpu_ids)))
        if self.switches_uid:
            inside += [
                self.setpriv, *user.setpriv_options(),
                "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs",
            ]  # fmt: skip
        # SIGTERM's default back before the shim, not in it: a stop that comes while the shim
        # starts must end it (a signal ignored then would be lost to the trainer).
        inside += [
            self.env,
            "--default-signal=TERM",
            *jobenv.command(argv, folders.cwd, shim_python),
        ]
        return [
            self.env,
            "--ignore-signal=TERM",
            self.bwrap,
            *self._namespaces(),
            *mounts(
                folders,
                [*python_paths(argv[0]), *python_paths(shim_python), JOBENV_SHIM, *self.shared],
            ),
            "--",
            *inside,
        ], env

    def _namespaces(self) -> list[str]:
        shared = ["--unshare-pid", "--unshare-ipc", "--unshare-cgroup-try", "--die-with-parent"]
        if self.switches_uid:
            # setpriv needs these two to become the job's uid; it drops every capability after.
            return [*shared, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        return ["--unshare-user", *shared]


def _shim_python(program: str) -> str:
    """The interpreter that runs workers/jobenv.py in front of `program`: the trainer's own
    where the program is a Python (its files are in the sandbox already), else the agent's."""
    return program if Path(program).name.startswith("python") else sys.executable


def exit_code(code: int | None, sandbox: Sandbox, in_container: bool = False) -> int | None:
    """A trainer's exit code as the supervisor reports it: negative for a signal, as Popen's.
    bwrap and a container runtime (`in_container`) both say a signal N as the code 128 + N."""
    if code is None or not (sandbox.isolation.isolated or in_container):
        return code
    if SIGNAL_EXIT_BASE < code <= SIGNAL_EXIT_BASE + MAX_SIGNAL:
        return SIGNAL_EXIT_BASE - code
    return code


def mounts(folders: Folders, python: Iterable[Path]) -> list[str]:
    """bwrap's options for the new root: system and Python read-only, the instance's folders
    writable, /proc of its own PID namespace, a minimal /dev with its GPUs."""
    read_only: list[Path] = []
    # First, so that folders bound under /tmp (a test's, say) show through it.
    options: list[str] = ["--perms", "1777", "--tmpfs", PRIVATE_TMP]
    for link in SYSTEM_LINKS:
        path = Path(link)
        if path.is_symlink():
            options += ["--symlink", os.readlink(path), link]
        elif path.is_dir():
            read_only.append(path)
    read_only += [Path(p) for p in SYSTEM_PATHS if Path(p).exists()]
    read_only += [*python, *folders.read_only, folders.cwd]
    writable = list(folders.writable)
    binds: list[tuple[str, Path, Path]] = []
    for path in _outermost(read_only, exclude=writable):
        binds.append(("--ro-bind", path, path))
    for path in _outermost(writable):
        binds.append(("--bind", path, path))
    for named in folders.named:
        # Where the job named it, from where it resolved to when it was checked.
        binds.append(("--bind" if named.writable else "--ro-bind", named.real, Path(named.path)))
    # Outer folders first: a writable folder inside a read-only one is bound over it.
    binds.sort(key=lambda b: len(b[2].parts))
    created: set[Path] = set()
    for _, _, dest in binds:
        for parent in reversed(dest.parents):
            covered = any(parent == d or parent.is_relative_to(d) for _, _, d in binds)
            if parent != Path("/") and parent not in created and not covered:
                # bwrap would copy the host's mode (/root is 0700); the trainer must pass.
                options += ["--perms", "0755", "--dir", str(parent)]
                created.add(parent)
    for kind, source, dest in binds:
        options += [kind, str(source), str(dest)]
    options += ["--proc", "/proc", "--dev", "/dev"]
    for gpu in folders.gpu_ids:
        options += ["--dev-bind-try", f"/dev/nvidia{gpu}", f"/dev/nvidia{gpu}"]
    if folders.gpu_ids:
        for device in GPU_CONTROL_DEVICES:
            options += ["--dev-bind-try", device, device]
    if folders.scratch is not None:
        # Shared by the processes of one instance (NCCL and DataLoader workers use it).
        options += ["--bind", str(shm_folder(folders.scratch)), PRIVATE_SHM]
    return options


def shm_folder(scratch: Path) -> Path:
    """The instance's /dev/shm on the host: beside its scratch folder, not in it. bwrap binds
    it by its path each time a process of the instance starts, after others may be running:
    in a folder the job can write to, a trainer could put a link there and have the next
    process's sandbox bind whatever it names, an agent's folder included. The scratch
    folder's parent (the attempt's) is the agent's alone."""
    return scratch.with_name(f".{scratch.name}.shm")


def scratch_folders(scratch: Path) -> list[Path]:
    """The folders an instance writes to on its node: its scratch folder, the `tmp` in it,
    and its /dev/shm; each to be handed to the job's uid."""
    return [scratch, scratch / "tmp", shm_folder(scratch)]


def prepare_scratch(scratch: Path) -> None:
    """The folders a scratch folder lends the sandbox as /tmp and /dev/shm (made before any
    trainer of the instance runs)."""
    for folder in scratch_folders(scratch)[1:]:
        folder.mkdir(exist_ok=True)


def _outermost(paths: list[Path], exclude: Iterable[Path] = ()) -> list[Path]:
    """The paths without those inside another (a bind of the outer one shows them already),
    without duplicates, and without any path that is one of `exclude` (bound another way)."""
    unique = sorted({Path(os.path.abspath(p)) for p in paths} - set(exclude))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


@functools.lru_cache(maxsize=16)
def _interpreter_paths(python: str) -> tuple[Path, ...]:
    """Where an interpreter's own files are: its prefixes and the folders on its path, asked of
    the interpreter itself once (a virtualenv's base Python may live anywhere, /root included)."""
    probe = (
        "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
        "sys.base_exec_prefix, *sys.path]))"
    )
    try:
        out = subprocess.run(
            [python, "-I", "-c", probe], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        found = [Path(p) for p in json.loads(out) if p and os.path.isabs(p)]
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.warning("could not ask %s where its files are: %s", python, exc)
        found = []
    real = Path(os.path.realpath(python))
    paths = [Path(python).parent.parent, real.parent.parent, *found]
    return tuple(p for p in paths if p.exists() and p != Path("/"))


def python_paths(program: str) -> tuple[Path, ...]:
    """The folders an interpreter needs read-only; nothing for a program that is no Python."""
    name = Path(program).name
    if not name.startswith("python"):
        return ()
    return _interpreter_paths(program)


def probe(
    uid_base: int = DEFAULT_UID_BASE, wanted: bool = True, shared: Iterable[Path] = ()
) -> Sandbox:
    """What this host can do: a sandbox with a uid of its own (root), one with the agent's uid
    (unprivileged user namespaces), or none, and why."""
    if not wanted:
        return Sandbox(Isolation.NONE, reason="the sandbox was turned off (--no-sandbox)")
    tools = {name: shutil.which(name) for name in ("bwrap", "setpriv", "env")}
    missing = sorted(name for name, path in tools.items() if path is None)
    if missing:
        hint = "install bubblewrap (apt-get install bubblewrap)" if "bwrap" in missing else ""
        return Sandbox(
            Isolation.NONE, reason=f"{', '.join(missing)} not found; {hint}".rstrip("; ")
        )
    bwrap, setpriv, env = (str(tools[n]) for n in ("bwrap", "setpriv", "env"))
    root = os.geteuid() == 0
    candidates = [Isolation.SANDBOX] if root else []
    candidates.append(Isolation.SANDBOX_SHARED_UID)
    problems = []
    shared = tuple(Path(os.path.abspath(p)) for p in shared)
    for isolation in candidates:
        sandbox = Sandbox(isolation, bwrap, setpriv, env, uid_base, shared=shared)
        problem = _try(sandbox)
        if problem is None:
            how = (
                f"trainers run as uid {uid_base}+user"
                if sandbox.switches_uid
                else "trainers keep the agent's uid (run the agent as root for a uid per user)"
            )
            return Sandbox(
                isolation, bwrap, setpriv, env, uid_base, f"bubblewrap sandbox; {how}", shared
            )
        problems.append(f"{isolation.value}: {problem}")
    return Sandbox(Isolation.NONE, reason="bubblewrap cannot run here: " + "; ".join(problems))


def _try(sandbox: Sandbox) -> str | None:
    """Run `true` in the sandbox; None when it works, else what bwrap said."""
    folders = Folders(cwd=Path("/usr"))
    env = {"PATH": os.environ.get("PATH", "")}
    argv, env = sandbox.wrap(["true"], folders, env, sandbox.user_of(0))
    try:
        result = subprocess.run(
            argv,
            env=jobenv.privileged_env(),
            input=jobenv.pack(env),
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if result.returncode != 0:
        said = result.stderr.decode(errors="replace").strip()
        return (said or f"exit code {result.returncode}").splitlines()[-1]
    return None


if __name__ == "__main__":  # python -m workers.sandbox: what this host can do
    found = probe()
    print(f"{found.isolation.value}: {found.reason}")
    sys.exit(0 if found.isolation.isolated else 1)
