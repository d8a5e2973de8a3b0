"""A cgroup per instance: what holds a job to the cores, memory, processes and devices its
package gave it, and the counters its use is measured by.

Every local process of an instance (the sandbox's, a container runtime's, the trainer's and its
children) runs in one cgroup made for that instance, below the agent's own:

    <agent's cgroup>/trainyard-<node>/<job>-<attempt>-<tag>

The agent, its keepers and Redis are never in one; a process joins its instance's group in the
death-signal shim (workers/deathsig.py), before the sandbox starts, so nothing of the instance
ever runs outside it. The limits, as Slurm's task/cgroup and Kubernetes' pod cgroups set them:
- memory: the package's memory, swap included (no swap beyond it); the kernel's OOM killer then
  picks within the instance, never the agent or another user's trainer;
- CPU: dedicated cores (cpuset), as Slurm's ConstrainCores gives them, where the node has as
  many free as the package's cores; and always a CFS quota of the package's cores
  (cpu.cfs_quota_us in v1, cpu.max in v2). A quota alone caps a busy job, but its processes
  still take turns with a neighbour's on every core: only dedicated cores keep the neighbour's
  speed;
- processes: pids.max (threads count, as the kernel counts tasks);
- devices (v1): the basic character devices and the instance's own GPUs, nothing else, behind
  the bind mounts the sandbox already makes.

Both layouts Linux has are read from /proc/self/mountinfo and /proc/self/cgroup: v1 (one
hierarchy per controller, as on this project's CI machines) and v2 (one unified hierarchy, as
systemd hosts run). Where neither can be had (not root, no memory controller, a read-only
/sys/fs/cgroup), the node says why in its heartbeat and the Nodes page shows "limits not
enforced".

The counters the console shows as use against the request (CPU-seconds, peak memory) and the
causes of an end (an OOM kill, the process limit hit) are read from the same groups.
"""

import dataclasses
import enum
import errno
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000
# Character devices every sandbox gets (bwrap's --dev): null, zero, full, random, urandom, tty,
# the pty master and the ptys ("*" for any minor). GPUs are added per instance.
BASIC_DEVICES: tuple[tuple[int, int | None], ...] = (
    (1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2), (136, None),
)  # fmt: skip
V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "devices", "cpuset")
V1_REQUIRED = ("memory", "cpu", "cpuacct", "pids")
V2_CONTROLLERS = ("memory", "cpu", "pids")
V2_OPTIONAL = ("cpuset",)
GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
NOWHERE = Path("/nonexistent")
# Where the groups of a v1 node's containers go, at the same path in every hierarchy: a
# container runtime takes one parent path for all of them (--cgroup-parent), and an agent's
# own place may differ between hierarchies (here: memory's is /process_api/<id>, the others /).
CONTAINERS_TOP = "trainyard-containers"


class Layout(enum.StrEnum):
    V1 = "cgroup-v1"
    V2 = "cgroup-v2"
    NONE = "none"


class CgroupError(RuntimeError):
    pass


@dataclass(frozen=True)
class Request:
    """What an instance's package gives it; 0 leaves that limit off."""

    memory_bytes: int = 0
    cpus: float = 0.0
    max_processes: int = 0
    # Character devices (major, minor) beyond BASIC_DEVICES: the instance's own GPUs.
    devices: tuple[tuple[int, int], ...] = ()
    # Cores of its own (cpuset); empty: any of the node's.
    cores: tuple[int, ...] = ()


@dataclass(frozen=True)
class Usage:
    """An instance's use, from its cgroup's own counters."""

    cpu_seconds: float = 0.0
    memory_peak_bytes: int = 0
    oom_kills: int = 0
    process_limit_hits: int = 0

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class Mount:
    root: str  # the path inside the hierarchy the mount shows (usually "/")
    point: Path
    fstype: str  # cgroup or cgroup2
    options: frozenset[str]


def read_mounts(mountinfo: str) -> list[Mount]:
    """The cgroup mounts of a /proc/PID/mountinfo text (proc(5))."""
    mounts = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = fields[4].replace("\\040", " ")
        mounts.append(Mount(fields[3], Path(point), tail[0], frozenset(tail[2].split(","))))
    return mounts


def read_memberships(proc_cgroup: str) -> dict[str, str]:
    """A /proc/PID/cgroup text as {controller: path}; the v2 hierarchy under ""."""
    found: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def _inside(mount: Mount, path: str) -> Path:
    """The folder of cgroup `path` under `mount` (a mount may show a sub-tree only)."""
    relative = path
    if mount.root != "/" and (path == mount.root or path.startswith(mount.root + "/")):
        relative = path[len(mount.root) :]
    return mount.point / relative.lstrip("/")


def _write(path: Path, value: str) -> None:
    # One write, as the kernel takes a value: no buffering that could split it.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _keyed(text: str) -> dict[str, int]:
    """`key value` lines (memory.events, pids.events, cpu.stat, memory.oom_control)."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            found[key] = int(value)
    return found


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """A kernel CPU list ("0-3,8,10-11") as core numbers."""
    cores: list[int] = []
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            cores.extend(range(int(first), int(last or first) + 1))
    return tuple(cores)


def cpu_list(cores: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))


def _number(text: str) -> int:
    text = text.strip()
    return int(text) if text.isdigit() else 0


class InstanceGroup:
    """One instance's cgroup: a folder per v1 hierarchy, or one v2 folder.

    A `nested` group holds no process itself: a container runtime makes a group per container
    below it (runc's libpod-<id>, conmon's), and removes each as its container ends. What the
    containers used stays counted here (CPU time and the memory watermark are charged to every
    ancestor), but the kernel counts an OOM kill and a refused fork in the container's own group
    on cgroup v1, which is gone by the time anyone asks: a limit set here that was reached is
    read as what ended them (`usage`)."""

    def __init__(self, layout: Layout, folders: dict[str, Path], nested: bool = False) -> None:
        self.layout = layout
        self.folders = folders
        self.nested = nested

    def procs_files(self) -> list[str]:
        """Where a process writes its pid to join the group (every hierarchy's)."""
        return sorted({str(folder / "cgroup.procs") for folder in self.folders.values()})

    def exists(self) -> bool:
        return all(folder.is_dir() for folder in self.folders.values())

    def pids(self) -> list[int]:
        """The processes in the group (a nested group's: in the groups below it)."""
        found: set[int] = set()
        files = [Path(name) for name in self.procs_files()]
        if self.nested:
            # Every process is in every hierarchy: one hierarchy's groups below say them all.
            below = self.folders.get("pids") or next(iter(self.folders.values()))
            files = list(below.rglob("cgroup.procs"))
        for path in files:
            found.update(int(p) for p in _read(path).split() if p.isdigit())
        return sorted(found)

    def now(self) -> tuple[float, int]:
        """CPU-seconds so far and the memory in use now, as container tools chart it (the
        working set: what is charged less the page cache the kernel may drop at once)."""
        if self.layout is Layout.V1:
            cpu = _number(_read(self.folders.get("cpuacct", NOWHERE) / "cpuacct.usage")) / 1e9
            memory = self.folders.get("memory", NOWHERE)
            charged = _number(_read(memory / "memory.usage_in_bytes"))
            inactive = _keyed(_read(memory / "memory.stat")).get("total_inactive_file", 0)
        else:
            folder = self.folders[""]
            cpu = _keyed(_read(folder / "cpu.stat")).get("usage_usec", 0) / 1e6
            charged = _number(_read(folder / "memory.current"))
            inactive = _keyed(_read(folder / "memory.stat")).get("inactive_file", 0)
        return cpu, max(0, charged - inactive)

    def usage(self) -> Usage:
        if self.layout is Layout.V1:
            # A controller the group is not in (a Slurm step without pids) reads as nothing.
            cpu, memory, pids = (
                self.folders.get(c, NOWHERE) for c in ("cpuacct", "memory", "pids")
            )
            found = Usage(
                cpu_seconds=_number(_read(cpu / "cpuacct.usage")) / 1e9,
                memory_peak_bytes=_number(_read(memory / "memory.max_usage_in_bytes")),
                oom_kills=_keyed(_read(memory / "memory.oom_control")).get("oom_kill", 0),
                process_limit_hits=_keyed(_read(pids / "pids.events")).get("max", 0),
            )
            memory_limit = _read(memory / "memory.limit_in_bytes")
        else:
            folder = pids = self.folders[""]
            memory_events = _keyed(_read(folder / "memory.events"))
            # memory.peak came with Linux 5.19; before it, what is in use now is the best known.
            peak = _read(folder / "memory.peak") or _read(folder / "memory.current")
            found = Usage(
                cpu_seconds=_keyed(_read(folder / "cpu.stat")).get("usage_usec", 0) / 1e6,
                memory_peak_bytes=_number(peak),
                oom_kills=memory_events.get("oom_kill", 0),
                process_limit_hits=_keyed(_read(folder / "pids.events")).get("max", 0),
            )
            memory_limit = _read(folder / "memory.max")
        if not self.nested:
            return found
        # The containers' groups counted their own OOM kills and refused forks, and are gone:
        # a watermark at this group's limit is the kernel's doing (the kill's SIGKILL decides
        # that it ended them: workers/limits.py killed_by_the_kernel).
        limit = _number(memory_limit)
        if limit and found.memory_peak_bytes >= limit:
            found = dataclasses.replace(found, oom_kills=max(found.oom_kills, 1))
        most = _number(_read(pids / "pids.max"))
        if most and _number(_read(pids / "pids.peak")) >= most:
            found = dataclasses.replace(found, process_limit_hits=max(found.process_limit_hits, 1))
        return found

    def remove(self) -> bool:
        """Remove the group once its processes are gone; False while any is left (the kernel
        refuses to remove a cgroup with a process in it). A nested group's left-over children
        go first (conmon's, which the runtime leaves behind)."""
        removed = True
        for folder in self.folders.values():
            if self.nested and folder.is_dir():
                for child in sorted(
                    (p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
                ):
                    try:
                        child.rmdir()
                    except OSError:
                        pass  # a process still in it: the group's own rmdir says so below
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    log.warning("cannot remove cgroup %s: %s", folder, exc)
                removed = False
        return removed


@dataclass(frozen=True)
class Cgroups:
    """What this node can hold its instances to, and where their groups go."""

    layout: Layout
    reason: str  # how limits are enforced, or why they are not
    # The node's folder in each hierarchy (v1: by controller; v2: under "").
    roots: tuple[tuple[str, Path], ...] = ()
    devices: bool = False  # whether devices are limited by the cgroup (v1's controller)
    # The cores the node's groups may use (cpuset); empty: cores are not given (no cpuset).
    cores: tuple[int, ...] = ()
    mems: str = ""  # the memory nodes, which every cpuset group must name
    # Node folders probe made that these groups do not use (cpuset, when there are no cores to
    # give): removed with the others when the agent stops, else each agent leaves one behind.
    unused_roots: tuple[tuple[str, Path], ...] = ()
    # Groups whose processes are a container runtime's, in groups it makes below them
    # (InstanceGroup.nested); `path` is the roots' cgroup path, the same in every hierarchy.
    nested: bool = False
    path: str = ""
    # Where this node's containers' groups go (its `nested` twin); None: nowhere known.
    containers: "Cgroups | None" = None

    @property
    def enforced(self) -> bool:
        return self.layout is not Layout.NONE

    def group(self, name: str) -> InstanceGroup:
        if not GROUP_NAME.match(name):
            raise CgroupError(f"not a cgroup name: {name!r}")
        return InstanceGroup(self.layout, {c: root / name for c, root in self.roots}, self.nested)

    def path_of(self, name: str) -> str:
        """The cgroup path of group `name`, as a container runtime's --cgroup-parent takes it."""
        return f"{self.path.rstrip('/')}/{name}"

    def create(self, name: str, request: Request) -> InstanceGroup:
        """The instance's group, made with its limits (a left-over one of the same name, empty
        after an earlier agent, is made anew)."""
        if not self.enforced:
            raise CgroupError(f"limits are not enforced on this node: {self.reason}")
        group = self.group(name)
        if self.nested:
            group.remove()  # a left-over one, with the runtime's empty groups in it
        for folder in group.folders.values():
            if folder.is_dir() and not _read(folder / "cgroup.procs").split():
                folder.rmdir()
            folder.mkdir()
        try:
            if self.layout is Layout.V1:
                _limit_v1(group.folders, request, self.devices)
            else:
                _limit_v2(group.folders[""], request)
                if self.nested:  # the runtime's groups below take the same controllers
                    _write(group.folders[""] / "cgroup.subtree_control", _enabled(self.roots))
            cpuset = group.folders.get("cpuset" if self.layout is Layout.V1 else "")
            if self.cores or (self.nested and self.layout is Layout.V1 and cpuset is not None):
                # Before any process joins: a cpuset group with no cores refuses them (and a
                # v1 runtime's child copies its parent's, so a nested group needs them too).
                assert cpuset is not None
                _write(cpuset / "cpuset.mems", self.mems or _read(cpuset.parent / "cpuset.mems"))
                cores = request.cores or self.cores
                _write(
                    cpuset / "cpuset.cpus",
                    cpu_list(cores) if cores else _read(cpuset.parent / "cpuset.cpus").strip(),
                )
        except OSError as exc:
            group.remove()
            raise CgroupError(f"cannot set the limits of cgroup {name}: {exc}") from exc
        return group

    def sweep(self, keep: Iterable[str] = ()) -> int:
        """Remove the empty groups an earlier agent left (one with a process left in it, held by
        a keeper, the kernel refuses to remove); returns how many went."""
        kept = set(keep)
        removed = 0
        names = {
            child.name
            for _, root in self.roots
            if root.is_dir()
            for child in root.iterdir()
            if child.is_dir()
        }
        for name in sorted(names - kept):
            if GROUP_NAME.match(name) and self.group(name).remove():
                removed += 1
        if self.containers is not None:
            removed += self.containers.sweep(keep)
        return removed

    def sharing_cores(self, advertised: int) -> "Cgroups":
        """These groups without dedicated cores where the node advertises more cores than it
        holds (an admin's overcommit, or several agents on one host, as `make run` starts
        them): it cannot give every instance cores of its own, and agents that each believed
        they could would pile their instances onto the same ones. The CPU quota holds."""
        if not self.cores or advertised <= len(self.cores):
            return self
        return dataclasses.replace(
            self,
            roots=tuple((c, r) for c, r in self.roots if c != "cpuset"),
            unused_roots=self.unused_roots + tuple((c, r) for c, r in self.roots if c == "cpuset"),
            cores=(),
            # Containers' groups keep their cpuset folders (a v1 runtime makes its own below
            # them either way), with the node's whole list.
            containers=(
                dataclasses.replace(self.containers, cores=())
                if self.containers is not None
                else None
            ),
            reason=self.reason.replace(", dedicated cores", "")
            + f" (cores shared: the node advertises {advertised}, it has {len(self.cores)})",
        )

    def remove_node_folders(self) -> None:
        """Remove the node's folders where no instance's group is left in them."""
        if self.containers is not None:
            self.containers.remove_node_folders()
        for _, root in self.roots + self.unused_roots:
            for folder in (
                [root, root.parent] if self.nested and self.layout is Layout.V1 else [root]
            ):
                try:
                    folder.rmdir()  # and a v1 /trainyard-containers no other agent uses
                except OSError:
                    pass  # a group still in it (its keeper holds it for the next agent), or gone


def _limit_v1(folders: dict[str, Path], request: Request, devices: bool) -> None:
    memory = folders["memory"]
    if request.memory_bytes:
        _write(memory / "memory.limit_in_bytes", str(request.memory_bytes))
        # Memory and swap together: no swap beyond the package's memory. Set after the memory
        # limit, which it may not be below. Absent where the kernel accounts no swap.
        if (memory / "memory.memsw.limit_in_bytes").exists():
            _write(memory / "memory.memsw.limit_in_bytes", str(request.memory_bytes))
    if request.cpus:
        _write(folders["cpu"] / "cpu.cfs_period_us", str(CFS_PERIOD_US))
        _write(folders["cpu"] / "cpu.cfs_quota_us", str(round(request.cpus * CFS_PERIOD_US)))
    if request.max_processes:
        _write(folders["pids"] / "pids.max", str(request.max_processes))
    if devices and "devices" in folders:
        _write(folders["devices"] / "devices.deny", "a")
        for major, minor in (*BASIC_DEVICES, *request.devices):
            _write(
                folders["devices"] / "devices.allow",
                f"c {major}:{'*' if minor is None else minor} rwm",
            )


def _limit_v2(folder: Path, request: Request) -> None:
    if request.memory_bytes:
        _write(folder / "memory.max", str(request.memory_bytes))
        if (folder / "memory.swap.max").exists():
            _write(folder / "memory.swap.max", "0")
        # One OOM kill ends the whole instance, as a failed process ends it anyway: no
        # half-killed trainer waiting on a dead DataLoader worker.
        if (folder / "memory.oom.group").exists():
            _write(folder / "memory.oom.group", "1")
    if request.cpus:
        _write(folder / "cpu.max", f"{round(request.cpus * CFS_PERIOD_US)} {CFS_PERIOD_US}")
    if request.max_processes:
        _write(folder / "pids.max", str(request.max_processes))


def _node_folder_name(node: str, workdir: str) -> str:
    """Named by node and work folder: two agents on one host (two stacks, or a test's) each
    sweep only their own left-overs."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", node)[:100] or "node"
    return f"trainyard-{cleaned}-{hashlib.sha256(workdir.encode()).hexdigest()[:8]}"


def probe(
    node: str,
    workdir: str = "",
    wanted: bool = True,
    mountinfo: str | None = None,
    proc_cgroup: str | None = None,
    try_it: bool = True,
) -> Cgroups:
    """Where this node's instance groups go, and with which layout; or why there are none.
    `mountinfo` and `proc_cgroup` default to this process's (tests pass a fake hierarchy's)."""
    if not wanted:
        return Cgroups(Layout.NONE, "limits were turned off (--no-limits)")
    if mountinfo is None:
        mountinfo = _read(Path("/proc/self/mountinfo"))
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup"))
    mounts = read_mounts(mountinfo)
    memberships = read_memberships(proc_cgroup)
    v1 = {
        controller: mount
        for mount in mounts
        if mount.fstype == "cgroup"
        for controller in V1_CONTROLLERS
        if controller in mount.options
    }
    name = _node_folder_name(node, workdir)
    problems = []
    if all(c in v1 for c in V1_REQUIRED):
        try:
            found = _prepare_v1(v1, memberships, name)
            found = dataclasses.replace(
                found, containers=_for_containers(_containers_v1, mounts, name, found)
            )
            return _tried(found) if try_it else found
        except (OSError, CgroupError) as exc:
            problems.append(f"cgroup v1: {exc}")
    elif v1:
        missing = ", ".join(c for c in V1_REQUIRED if c not in v1)
        problems.append(f"cgroup v1 without the {missing} controller")
    unified = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if unified is not None and "" in memberships:
        try:
            found = _prepare_v2(unified, memberships[""], name)
            found = dataclasses.replace(
                found,
                containers=_for_containers(_containers_v2, unified, memberships[""], name, found),
            )
            return _tried(found) if try_it else found
        except (OSError, CgroupError) as exc:
            problems.append(f"cgroup v2: {exc}")
    if not problems:
        problems.append("no cgroup file system is mounted")
    return Cgroups(Layout.NONE, "; ".join(problems))


def _prepare_v1(v1: dict[str, Mount], memberships: dict[str, str], name: str) -> Cgroups:
    roots = []
    cores: tuple[int, ...] = ()
    mems = ""
    for controller, mount in v1.items():
        own = memberships.get(controller, "/")
        root = _inside(mount, own) / name
        root.mkdir(exist_ok=True)
        if controller == "cpuset":
            # v1 gives a new cpuset group no cores and no memory nodes: the node's folder
            # takes its parent's, which its instances' groups then divide.
            cores, mems = _cpuset_from_parent(root)
        if controller == "memory" and (root / "memory.use_hierarchy").exists():
            # Children count against this folder (the default since Linux 5.x; older kernels
            # need it set before the first child).
            try:
                _write(root / "memory.use_hierarchy", "1")
            except OSError:
                pass
        roots.append((controller, root))
    unused = [(c, r) for c, r in roots if c == "cpuset" and not cores]
    if unused:
        # No cores to give: instances use the node's, without a cpuset group.
        roots = [(c, r) for c, r in roots if c != "cpuset"]
    return Cgroups(
        Layout.V1,
        "cgroup v1: memory, CPU quota"
        + (", dedicated cores" if cores else "")
        + ", process limit"
        + (", devices" if "devices" in v1 else "")
        + " per instance",
        tuple(roots),
        devices="devices" in v1,
        cores=cores,
        mems=mems,
        unused_roots=tuple(unused),
    )


def _cpuset_from_parent(folder: Path) -> tuple[tuple[int, ...], str]:
    """Give a new cpuset folder its parent's cores and memory nodes (where it has none yet);
    the cores it then holds, and its memory nodes."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        if not _read(folder / name).strip():
            _write(folder / name, _read(folder.parent / name).strip())
    return parse_cpu_list(_read(folder / "cpuset.cpus")), _read(folder / "cpuset.mems").strip()


def _prepare_v2(mount: Mount, own: str, name: str) -> Cgroups:
    available = set(_read(mount.point / "cgroup.controllers").split())
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        raise CgroupError(
            f"the unified hierarchy at {mount.point} has no {', '.join(missing)} controller "
            "(bound to cgroup v1?)"
        )
    parent = _inside(mount, own)
    wanted = [*V2_CONTROLLERS, *(c for c in V2_OPTIONAL if c in available)]
    enable = " ".join(f"+{c}" for c in wanted)
    try:
        _write(parent / "cgroup.subtree_control", enable)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        # v2 lets no cgroup but the root hold processes and give controllers to children:
        # this agent moves to a leaf of its own first, as systemd's delegation asks.
        leaf = parent / "trainyard-agent"
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(os.getpid()))
        try:
            _write(parent / "cgroup.subtree_control", enable)
        except OSError as again:
            raise CgroupError(
                f"{parent} holds other processes, so it cannot give controllers to children: "
                "run the agent in a cgroup of its own (systemd: a unit with Delegate=yes)"
            ) from again
    root = parent / name
    root.mkdir(exist_ok=True)
    _write(root / "cgroup.subtree_control", enable)
    # v2 groups use their parent's cores until told otherwise: the effective list is the node's.
    cores = parse_cpu_list(_read(root / "cpuset.cpus.effective")) if "cpuset" in wanted else ()
    return Cgroups(
        Layout.V2,
        "cgroup v2: memory, CPU quota"
        + (", dedicated cores" if cores else "")
        + ", process limit per instance (devices: the sandbox's)",
        (("", root),),
        cores=cores,
        mems=_read(root / "cpuset.mems.effective").strip(),
    )


def _for_containers(make: Callable[..., Cgroups], *args: Any) -> Cgroups | None:
    """The containers' twin of a node's groups; None (the runtime's own flags then hold its
    containers) where its folders cannot be made."""
    try:
        return make(*args)
    except OSError as exc:
        log.warning("no cgroups for containers, the runtime's flags hold them: %s", exc)
        return None


def _containers_v1(mounts: list[Mount], name: str, node: Cgroups) -> Cgroups:
    """The folders of this node's containers' groups: /trainyard-containers/<node folder> in
    every hierarchy. Every one, not only the controllers Trainyard limits: a runtime makes its
    groups in each (freezer, blkio, the unified one of a hybrid host), and what it leaves
    there (conmon's) goes with the instance's group."""
    path = f"/{CONTAINERS_TOP}/{name}"
    roots: dict[str, Path] = {}
    for mount in mounts:
        controllers = [c for c in V1_CONTROLLERS if c in mount.options]
        for key in controllers or [f"other:{mount.point}"]:
            roots[key] = _inside(mount, path)
    for key, root in roots.items():
        root.mkdir(parents=True, exist_ok=True)
        if key == "cpuset":  # each new level takes its parent's cores, as the node's folder
            _cpuset_from_parent(root.parent)
            _cpuset_from_parent(root)
    return Cgroups(
        Layout.V1,
        "containers' groups: " + path,
        tuple(sorted(roots.items())),
        cores=node.cores,
        mems=node.mems,
        nested=True,
        path=path,
    )


def _containers_v2(mount: Mount, own: str, name: str, node: Cgroups) -> Cgroups:
    """The folder of this node's containers' groups on a v2 host: beside the node's folder,
    in the agent's own place (all a systemd delegation gives it)."""
    folder = _inside(mount, own) / f"{name}-containers"
    folder.mkdir(exist_ok=True)
    _write(folder / "cgroup.subtree_control", _enabled(node.roots))
    return Cgroups(
        Layout.V2,
        f"containers' groups: {folder}",
        (("", folder),),
        cores=node.cores,
        mems=node.mems,
        nested=True,
        path=f"{own.rstrip('/')}/{folder.name}",
    )


def _enabled(roots: tuple[tuple[str, Path], ...]) -> str:
    """A v2 folder's controllers as cgroup.subtree_control takes them for its children."""
    return " ".join(
        f"+{c.lstrip('+')}"
        for _, root in roots
        for c in _read(root / "cgroup.subtree_control").split()
    )


def _tried(found: Cgroups) -> Cgroups:
    """Make, limit and remove a group once: a node that cannot is not enforcing limits. One
    whose containers' folders cannot be used runs containers under the runtime's own flags."""
    probe_name = f"probe-{os.getpid()}"
    try:
        group = found.create(probe_name, Request(memory_bytes=64 << 20, cpus=1, max_processes=8))
    except (OSError, CgroupError) as exc:
        return Cgroups(Layout.NONE, f"{found.layout.value} is there but cannot be used: {exc}")
    group.remove()
    if found.containers is not None:
        try:
            found.containers.create(probe_name, Request(memory_bytes=64 << 20)).remove()
        except (OSError, CgroupError) as exc:
            log.warning(
                "containers' cgroups cannot be used, the runtime's flags hold them: %s", exc
            )
            return dataclasses.replace(found, containers=None)
    return found


# Where Slurm's task/cgroup puts a step's task: .../job_<id>/step_<id>[/task_<n>] (v1 and v2).
SLURM_STEP = re.compile(r"/job_\d+/step_[^/]+(?:/task_\d+)?$")


def slurm_step_usage(mountinfo: str | None = None, proc_cgroup: str | None = None) -> Usage | None:
    """What this process's Slurm step task used so far, from the cgroups Slurm's task/cgroup
    made (the Slurm step wrapper reads it once its trainers have ended: they were its children,
    in its groups); None outside such a group (proctrack/linuxproc: no counters of the step's
    own). An OOM kill is counted where Slurm set the limit: the job's or the step's group."""
    if mountinfo is None:
        mountinfo = _read(Path("/proc/self/mountinfo"))
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup"))
    memberships = read_memberships(proc_cgroup)
    folders: dict[str, Path] = {}
    layout = Layout.V1
    for mount in read_mounts(mountinfo):
        for controller in ("cpuacct", "memory", "pids") if mount.fstype == "cgroup" else ("",):
            if controller and controller not in mount.options:
                continue
            path = memberships.get(controller, "")
            if SLURM_STEP.search(path):
                folders[controller] = _inside(mount, path)
                layout = Layout.V2 if controller == "" else Layout.V1
    if not folders:
        return None
    usage = InstanceGroup(layout, folders).usage()
    memory = folders.get("memory" if layout is Layout.V1 else "")
    if memory is None:
        return usage
    events = "memory.oom_control" if layout is Layout.V1 else "memory.events"
    kills = 0
    folder = memory
    while SLURM_STEP.search(str(folder)) or re.search(r"/job_\d+$", str(folder)):
        kills += _keyed(_read(folder / events)).get("oom_kill", 0)
        folder = folder.parent
    return dataclasses.replace(usage, oom_kills=max(kills, usage.oom_kills))


def lower_oom_priority(score: int = -900) -> str | None:
    """Make this process (and what it starts: keepers, Redis) the OOM killer's last choice;
    None when done, else why not (lowering needs CAP_SYS_RESOURCE)."""
    try:
        _write(Path("/proc/self/oom_score_adj"), str(score))
    except OSError as exc:
        return str(exc)
    return None
