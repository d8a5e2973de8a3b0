"""Images that are containers: a trainer process run by docker or podman instead of the host's
Python.

When a job's image names a container image (`FrameworkImage.container_image`), each of an
instance's processes runs in a container of its own, with
- the host's network and IPC namespaces (`--network host --ipc host`): MASTER_ADDR, the node's
  interface and NCCL's shared memory work as they do outside;
- the same folders at the same paths: the code (the job's snapshot, or the code root), the
  instance's folder (its metrics channel), the job's checkpoint folder, and the trainer library;
- the GPUs the agent assigned to the instance, renumbered from 0 inside as the runtime does;
- the environment in a file only the agent reads (`--env-file`), never on a command line;
- `--init`, so that SIGTERM reaches the trainer and orphans are reaped;
- labels naming the node and the agent's work dir, so that an agent that starts again removes
  what its previous incarnation left, and nothing of another agent's on the same host.

Stopping the `run` process does not always stop the container (a SIGKILL never reaches it), so
the supervisor removes it by name afterwards (`remove_argv`).
"""

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from workers.cgroups import Request
from workers.launcher import INHERITED_ENV, WORKERS_PACKAGE, LocalProcess
from workers.unixids import JobUser

# podman first: it needs no daemon, so where it is installed it runs; a docker client may be
# installed on a host whose daemon is not (or is not ours to use).
RUNTIMES = ("podman", "docker")
NODE_LABEL = "trainyard.node"
# The agent's work dir: agents of other consoles (or test stacks) on the same host may use the
# same node name, and one that starts must remove only what its own earlier run left.
AGENT_LABEL = "trainyard.workdir"
PYTHON_IN_IMAGE = "python"  # the image's own interpreter, found on its PATH
# podman's settings file, where a site keeps its own beside the system's (deploy/podman/).
CONTAINERS_CONF_ENV = "CONTAINERS_CONF"
RUNTIME_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ContainerError(RuntimeError):
    pass


@dataclass(frozen=True)
class Runtime:
    """A container engine as the agent runs it: its executable, and for podman the settings
    file the host needs (deploy/podman/containers.conf says which and why)."""

    path: str
    config: Path | None = None

    @property
    def is_podman(self) -> bool:
        return Path(self.path).name == "podman"

    def env(self) -> dict[str, str]:
        """The runtime's whole environment: fixed by the agent, none of it the job's (the
        job's variables reach the container through its env file only)."""
        env = {"PATH": RUNTIME_PATH}
        if self.config is not None:
            env[CONTAINERS_CONF_ENV] = str(self.config)
        return env


def find_runtime(preferred: str | None = None, config: Path | None = None) -> Runtime | None:
    """The runtime: `preferred` if given (a name or a path), else podman, else docker."""
    for name in [preferred] if preferred else RUNTIMES:
        found = shutil.which(name)
        if found:
            return Runtime(found, config)
    return None


# Where the agent's own `workers` package appears in a container that runs a built-in example
# (the examples import it); only that package, so nothing else of the agent's environment
# shadows the image's own libraries.
LIBRARY_INSIDE = Path("/opt/trainyard/lib")


@dataclass(frozen=True)
class Mount:
    path: Path  # outside
    inside: Path | None = None  # None: the same path inside
    read_only: bool = False

    def option(self) -> str:
        return f"{self.path}:{self.inside or self.path}" + (":ro" if self.read_only else "")


def example_layout(script: Path) -> tuple[Mount, Path]:
    """A built-in example: the mount of the `workers` package, and the script's path inside."""
    inside = LIBRARY_INSIDE / WORKERS_PACKAGE.name
    return (
        Mount(WORKERS_PACKAGE, inside, read_only=True),
        inside / script.resolve().relative_to(WORKERS_PACKAGE),
    )


def container_name(job_id: int, attempt: int, tag: str, local_rank: int, agent: Path) -> str:
    """Unique on the host: another console's agent there (or a test stack's) may run a job of
    the same number, and the runtime refuses a second container of a name in use. The agent's
    work dir tells them apart, as its label does."""
    mark = hashlib.sha256(str(agent).encode()).hexdigest()[:8]
    return f"trainyard-{job_id}-a{attempt}-{tag}-{local_rank}-{mark}"


def container_env(
    process: LocalProcess, gpu_ids: list[int], library: bool = False
) -> dict[str, str]:
    """The process's environment as the container gets it: the image keeps its own PATH,
    HOME and libraries, sees its GPUs numbered 0..k-1, and (`library`) imports `workers`."""
    env = {k: v for k, v in process.env.items() if k not in INHERITED_ENV}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpu_ids)))
    if library:
        env["PYTHONPATH"] = f"{LIBRARY_INSIDE}:{env.get('PYTHONPATH', '')}".rstrip(":")
    return env


def write_env_file(path: Path, env: dict[str, str]) -> None:
    """docker's and podman's --env-file: KEY=VALUE lines, read as they are (no quoting)."""
    bad = sorted(k for k, v in env.items() if "\n" in v or "\n" in k or "=" in k)
    if bad:
        raise ContainerError(f"variables that an env file cannot carry: {', '.join(bad)}")
    # The caller puts it in the attempt's folder, where no job writes; all the same, whatever
    # is at its name is removed (unlink follows no link) and the file made anew: it is never
    # written through a link, nor readable to anyone but root and the job.
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("".join(f"{k}={v}\n" for k, v in sorted(env.items())))


def run_argv(
    runtime: str,
    image: str,
    name: str,
    node: str,
    process: LocalProcess,
    workdir: Path,
    mounts: list[Mount],
    env_file: Path,
    gpu_ids: list[int],
    script: Path | None = None,
    user: JobUser | None = None,
    shared_ipc: bool = False,
    limits: Request | None = None,
    agent: Path | None = None,
    cgroup_parent: str | None = None,
) -> list[str]:
    """The argv that runs `process` (its script, or `script` inside the image, and its
    arguments) in `image`.

    As in the bubblewrap sandbox (workers/sandbox.py): the job's user (`user`: their uid, gid
    and groups, where the agent may give them), no capability, no privilege gained by exec, a
    read-only image with a private /tmp, and its own PID namespace (docker's default). The
    host's IPC namespace only for an instance of several processes (`shared_ipc`), whose NCCL
    talks through shared memory; a lone process gets a private one.

    `cgroup_parent`: the instance's group for containers (workers/cgroups.py), which holds its
    package for all of its containers together and keeps their counters; `limits` then stay
    off. Without one (a node that enforces no limits), the runtime's flags hold each container
    to `limits`, its share of the package."""
    argv = [
        runtime, "run", "--rm", "--name", name, "--label", f"{NODE_LABEL}={node}",
        "--network", "host", "--ipc", "host" if shared_ipc else "private", "--init",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--read-only", "--tmpfs", "/tmp",  # noqa: S108 (the container's own /tmp)
        "--env-file", str(env_file), "--workdir", str(workdir),
    ]  # fmt: skip
    if agent is not None:
        argv += ["--label", f"{AGENT_LABEL}={agent}"]
    if user is not None:
        argv += ["--user", f"{user.uid}:{user.gid}"]
        for group in user.groups:
            if group != user.gid:  # the person's other groups, as at their login
                argv += ["--group-add", str(group)]
    if cgroup_parent is not None:
        argv += ["--cgroup-parent", cgroup_parent]
    elif limits is not None:
        argv += limit_options(limits)
    for mount in mounts:
        argv += ["--volume", mount.option()]
    if gpu_ids:
        ids = ",".join(str(g) for g in gpu_ids)
        if Path(runtime).name == "podman":
            for gpu in gpu_ids:  # the NVIDIA Container Toolkit's CDI names
                argv += ["--device", f"nvidia.com/gpu={gpu}"]
        else:
            # The quotes are part of the value: docker splits --gpus on commas otherwise.
            argv += ["--gpus", f'"device={ids}"']
    script_inside = str(script) if script is not None else process.argv[1]
    return [*argv, image, PYTHON_IN_IMAGE, script_inside, *process.argv[2:]]


def limit_options(limits: Request) -> list[str]:
    """The runtime's own flags for a container's share of its instance's package: the
    container runs under the runtime's cgroup, not the instance's (workers/cgroups.py)."""
    options = []
    if limits.memory_bytes:
        # --memory-swap equal to --memory: no swap beyond it, as for a sandboxed instance.
        options += ["--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes)]
    if limits.cpus:
        options += ["--cpus", f"{limits.cpus:g}"]
    if limits.max_processes:
        options += ["--pids-limit", str(limits.max_processes)]
    if limits.cores:
        options += ["--cpuset-cpus", ",".join(str(c) for c in limits.cores)]
    return options


def remove_argv(runtime: str, name: str) -> list[str]:
    """Removes the container whatever its state; succeeds quietly if it is already gone."""
    return (
        [runtime, "rm", "--force", "--ignore", name]
        if Path(runtime).name == "podman"
        else [
            runtime,
            "rm",
            "--force",
            name,
        ]
    )


def image_exists_argv(runtime: str, reference: str) -> list[str]:
    """Exits 0 when the image is on this host, without pulling it."""
    if Path(runtime).name == "podman":
        return [runtime, "image", "exists", reference]
    return [runtime, "image", "inspect", "--format", "{{.Id}}", reference]


def leftovers_argv(runtime: str, node: str, agent: Path) -> list[str]:
    """Lists (by name, as the keepers record them) the containers this node's agent on the
    work dir `agent` started, running or not (both labels: the runtime ANDs its filters)."""
    return [
        runtime, "ps", "--all", "--filter", f"label={NODE_LABEL}={node}",
        "--filter", f"label={AGENT_LABEL}={agent}", "--format", "{{.Names}}",
    ]  # fmt: skip
