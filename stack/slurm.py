"""A real Slurm cluster of three nodes on one machine, from an empty folder, for tests and trials.

    cluster = SlurmCluster.start()          # munged, slurmctld and three slurmd
    cluster.command(["sinfo"])              # Slurm's own client commands, on this cluster
    cluster.stop()                          # by the PIDs it recorded, and whatever ran inside

`python -m stack.slurm` (`make slurm`) starts one beside `make run` and stops it on Ctrl-C.

Debian's `slurm-wlm` and `munge` (22.05) build it. Where root can make network namespaces
(stack/netns.py) each slurmd is a "host" of its own, with its own address on a bridge, so a job
across the three nodes sends its gloo traffic between real addresses; elsewhere the three
slurmd share this host's loopback, each on its own port (Debian's build allows several slurmd
on one host, told apart by `-N`).

Limits, as a site's task/cgroup sets them: where this machine has cgroup v1 hierarchies for
cpuset, memory, devices, freezer and cpuacct, Slurm's cgroup/v1 plugin runs with
task/cgroup,task/affinity and jobacct_gather/cgroup (ConstrainCores,
ConstrainRAMSpace, ConstrainSwapSpace, ConstrainDevices), and memory is a consumable resource
(CR_CPU_Memory): a step gets its --cpus-per-task as cores of its own and is OOM-killed past its
--mem (Slurm: OUT_OF_MEMORY). Each cluster has a group of its own per controller, below this
process's (`<own cgroup>/trainyard-slurm-<token>`), which cgroup.conf's CgroupMountpoint
points at through symlinks (`<root>/cgroup/<controller>`); the three slurmd make their
`slurm_<node>` groups there, as Debian's --enable-multiple-slurmd build names them. The
process tracking stays proctrack/linuxproc (CGROUP_PROCTRACK says why). Elsewhere
(cgroup v2 only: Slurm 22.05's cgroup/v2 wants systemd; no cgroups; `cgroups=False`) it falls
back to proctrack/linuxproc and task/none, with no limits. docs/slurm.md: "Limits on Slurm
pools".

Accounting, where Debian's slurmdbd and mariadb-server are installed: slurmdbd on a MariaDB of
the cluster's own (stack/slurm_accounting.py), so `sacct` and `sacctmgr` work; elsewhere none,
as a small site without it. PMIx is left out. munged runs as the `munge` user with its socket
in a folder of mode 755; slurmctld and slurmd run as root, as at a real site.

Every process is started with an argv list, never a shell, and its PID goes into
`<root>/pids.json`; stop() signals exactly those PIDs, then anything still running inside the
cluster's own network namespaces (a job step's processes, which slurmstepd keeps after slurmd
has gone), and removes the namespaces; then whatever is left in the cluster's cgroups, and
the groups.
"""

import argparse
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from stack import netns, slurm_accounting
from stack.redis_server import free_port
from workers import cgroups as cgroup_files
from workers import deathsig

PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "srun")
MUNGE_USER = "munge"
PARTITION = "trainyard"
USERS_PARTITION = "people"
# The first node alone: a smaller partition beside the others, for pools of several partitions.
FIRST_NODE_PARTITION = "first-node"
PARTITIONS = (PARTITION, USERS_PARTITION, FIRST_NODE_PARTITION)
# Each node's size: every node advertises this much, whatever the machine has; Slurm only
# checks that the machine has at least as much (it reports the whole machine to every slurmd).
NODE_CPUS = 2
NODE_MEMORY_MB = 16000
# Seconds: how long slurmctld waits for a silent slurmd before it marks the node DOWN and fails
# the jobs on it (NODE_FAIL). Slurm's default is 300; a test of a lost node should not wait that.
SLURMD_TIMEOUT = 10
# How long a job's processes have between scancel's SIGTERM and its SIGKILL (Slurm: KillWait).
KILL_WAIT = 15
# The cgroup v1 controllers Slurm's cgroup/v1 plugin uses here: cpuset and memory (task/cgroup's
# ConstrainCores and ConstrainRAMSpace), devices (ConstrainDevices), freezer (proctrack/cgroup)
# and cpuacct (jobacct_gather/cgroup).
CGROUP_CONTROLLERS = ("cpuset", "memory", "devices", "freezer", "cpuacct")
# The process tracking beside task/cgroup. Not proctrack/cgroup, which sites run: it sends a
# step's SIGTERM (scancel, a time limit) to slurmstepd's own children only, the step wrappers,
# and a wrapper stopped while it starts its sandbox passes it on before the trainer exists, so
# the trainer runs on until KillWait's SIGKILL and no outcome is written (test_slurm.py's
# test_scancel_ends_the_slurm_job_and_every_process failed 2 runs in 4 with it).
# proctrack/linuxproc sends it to every process of the step, as without cgroups.
CGROUP_PROCTRACK = "proctrack/linuxproc"
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


class SlurmUnavailable(RuntimeError):
    """Slurm cannot run here; the message says why in one line."""


def unavailable_reason() -> str | None:
    missing = slurm_accounting.missing_reason("Slurm is not installed", BINARIES, PACKAGES)
    if missing:
        return missing
    try:
        pwd.getpwnam(MUNGE_USER)
    except KeyError:
        return "there is no 'munge' user (Debian's munge package makes it)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs as their users"
    return None


def cgroup_unavailable_reason() -> str | None:
    """Why Slurm's task/cgroup cannot run here (None: it can): it needs a writable cgroup v1
    hierarchy for each of CGROUP_CONTROLLERS (Slurm 22.05's cgroup/v2 plugin needs systemd)."""
    hierarchies = _cgroup_hierarchies()
    missing = [c for c in CGROUP_CONTROLLERS if c not in hierarchies]
    if missing:
        return (
            f"no cgroup v1 hierarchy for {', '.join(missing)} "
            "(Slurm 22.05's cgroup/v2 plugin needs systemd)"
        )
    read_only = [c for c, m in hierarchies.items() if "ro" in m.options]
    if read_only:
        return f"the cgroup v1 hierarchies of {', '.join(read_only)} are read-only"
    if os.geteuid() != 0:
        return "only root can make cgroups for slurmd"
    return None


def _cgroup_hierarchies() -> dict[str, cgroup_files.Mount]:
    """This process's cgroup v1 mounts by controller (the first that shows the whole tree)."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return {}
    found: dict[str, cgroup_files.Mount] = {}
    for mount in cgroup_files.read_mounts(mountinfo):
        for controller in CGROUP_CONTROLLERS:
            if mount.fstype == "cgroup" and controller in mount.options:
                found.setdefault(controller, mount)
    return found


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str
    port: int


@dataclass
class SlurmCluster:
    root: Path
    nodes: list[SlurmNode]
    controller_address: str
    controller_port: int
    pids: dict[str, int] = field(default_factory=dict)
    network: netns.HostNetwork | None = None
    # Slurm's task/cgroup is on: the cluster's own group for each of CGROUP_CONTROLLERS, where
    # the slurmd make theirs. Empty: no limits, for `cgroups_off`'s reason.
    cgroups: list[Path] = field(default_factory=list)
    cgroups_off: str = ""
    # slurmdbd and its MariaDB (stack/slurm_accounting.py); None: no accounting, for
    # `accounting_off`'s reason.
    accounting: slurm_accounting.Accounting | None = None
    accounting_off: str = ""

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket.2"

    @property
    def partition(self) -> str:
        return PARTITION

    @property
    def cgroup_mountpoint(self) -> Path:
        """cgroup.conf's CgroupMountpoint: a folder of symlinks, one per controller, to the
        cluster's own groups (Slurm makes `slurm_<node>` below each)."""
        return self.root / "cgroup"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment in which Slurm's client commands talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def command(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one of Slurm's client commands against this cluster (an argv, never a shell)."""
        return subprocess.run(
            argv, env=self.env(), capture_output=True, text=True, check=check, timeout=60
        )

    # -- starting ---------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        root: Path | None = None,
        nodes: int = 3,
        use_namespaces: bool | None = None,
        cgroups: bool | None = None,
        accounting: bool | None = None,
    ) -> "SlurmCluster":
        """`cgroups`: Slurm's task/cgroup (limits); None: where the machine allows it, True:
        or SlurmUnavailable saying why not, False: never (proctrack/linuxproc, task/none).
        `accounting`: slurmdbd and sacct, the same way (stack/slurm_accounting.py)."""
        reason = unavailable_reason()
        if reason:
            raise SlurmUnavailable(reason)
        cgroups_off = "turned off" if cgroups is False else cgroup_unavailable_reason() or ""
        if cgroups and cgroups_off:
            raise SlurmUnavailable(f"task/cgroup cannot run here: {cgroups_off}")
        accounting_off = (
            "turned off" if accounting is False else slurm_accounting.unavailable_reason() or ""
        )
        if accounting and accounting_off:
            raise SlurmUnavailable(accounting_off)
        if root is None:
            # Not under pytest's 0700 folders: munged, running as its own user, must reach it.
            root = Path(tempfile.mkdtemp(prefix="trainyard-slurm-"))
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        if use_namespaces is None:
            use_namespaces = netns.unavailable_reason() is None
        network = netns.HostNetwork.create(nodes) if use_namespaces else None
        if network is not None:
            slurm_nodes = [
                SlurmNode(f"n{i}", host.address, 6818) for i, host in enumerate(network.hosts, 1)
            ]
            controller = network.gateway
        else:
            used: set[int] = set()
            slurm_nodes = []
            for i in range(1, nodes + 1):
                port = free_port()
                while port in used:
                    port = free_port()
                used.add(port)
                slurm_nodes.append(SlurmNode(f"n{i}", "127.0.0.1", port))
            controller = "127.0.0.1"
        cluster = cls(
            root=root,
            nodes=slurm_nodes,
            controller_address=controller,
            controller_port=free_port(),
            network=network,
            cgroups_off=cgroups_off,
            accounting=None if accounting_off else slurm_accounting.Accounting.plan(root),
            accounting_off=accounting_off,
        )
        try:
            if not cgroups_off:
                cluster._make_cgroups()
            cluster._start_munge()
            cluster._write_conf()
            if cluster.accounting is not None:
                cluster._start_accounting(cluster.accounting)
            cluster._start_controller()
            for i, node in enumerate(cluster.nodes):
                cluster._start_slurmd(node, network.hosts[i] if network else None)
            cluster._wait_until_idle()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _record(self, name: str, pid: int) -> None:
        self.pids[name] = pid
        self._write_record()

    def _write_record(self) -> None:
        record = {
            "pids": self.pids,
            "network": self.network.tag if self.network else None,
            "cgroups": [str(folder) for folder in self.cgroups],
        }
        (self.root / "pids.json").write_text(json.dumps(record, indent=1) + "\n")

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, tie: bool = True
    ) -> None:
        """Start a daemon; `tie`: it dies with this process (workers/deathsig.py), so a test or
        bench killed outright leaves no Slurm behind (the shim execs: the PID is the daemon's)."""
        log = (self.root / "log" / f"{name}.out").open("ab")
        process = subprocess.Popen(
            deathsig.command(argv) if tie else argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        self._record(name, process.pid)

    def _make_cgroups(self) -> None:
        """The cluster's own group in each controller, below this process's own (so that its
        jobs count where this process does), and CgroupMountpoint's symlinks to them."""
        hierarchies = _cgroup_hierarchies()
        try:
            memberships = cgroup_files.read_memberships(Path("/proc/self/cgroup").read_text())
        except OSError as exc:
            raise SlurmUnavailable(f"cannot read /proc/self/cgroup: {exc}") from exc
        name = f"trainyard-slurm-{secrets.token_hex(4)}"
        self.cgroup_mountpoint.mkdir(exist_ok=True)
        for controller in CGROUP_CONTROLLERS:
            mount = hierarchies[controller]
            own = memberships.get(controller, "/")
            if mount.root != "/" and (own == mount.root or own.startswith(mount.root + "/")):
                own = own[len(mount.root) :]
            folder = mount.point / own.lstrip("/") / name
            folder.mkdir()
            self.cgroups.append(folder)
            self._write_record()
            if controller == "cpuset":
                # v1 gives a new cpuset group no cores and no memory nodes: it takes its
                # parent's, which Slurm's slurm_<node> groups then copy.
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (folder / knob).write_text((folder.parent / knob).read_text().strip())
            (self.cgroup_mountpoint / controller).symlink_to(folder)

    def _start_munge(self) -> None:
        (self.root / "log").mkdir(exist_ok=True)
        munge = self.root / "munge"
        munge.mkdir(mode=0o755, exist_ok=True)
        user = pwd.getpwnam(MUNGE_USER)
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        for path in (munge, key):
            os.chown(path, user.pw_uid, user.pw_gid)
        # setpriv sets the death signal itself, after its change of uid (which clears one set
        # before it). Not through workers/deathsig.py: munged runs as `munge`, which may not
        # read this checkout (a clone under root's home, a mktemp -d folder): nothing of the
        # checkout runs as another user.
        self._spawn(
            "munged",
            [
                "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                "--pdeathsig", "KILL", "munged", "--foreground",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--log-file={munge / 'munged.log'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            tie=False,
        )  # fmt: skip
        _wait_for(lambda: self.munge_socket.exists(), "munged to open its socket", self.root)

    def _write_conf(self) -> None:
        for folder in ("state", "spool"):
            (self.root / folder).mkdir(exist_ok=True)
        for node in self.nodes:
            (self.root / "spool" / node.name).mkdir(exist_ok=True)
        # slurmctld takes the role of the controller only on the host SlurmctldHost names.
        hostname = socket.gethostname().split(".")[0]
        lines = [
            "ClusterName=trainyard",
            f"SlurmctldHost={hostname}({self.controller_address})",
            f"SlurmctldPort={self.controller_port}",
            "AuthType=auth/munge",
            "CryptoType=crypto/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd-%n.log'}",
            *(
                [
                    f"ProctrackType={CGROUP_PROCTRACK}",
                    "TaskPlugin=task/cgroup,task/affinity",
                    "JobAcctGatherType=jobacct_gather/cgroup",
                ]
                if self.cgroups
                else [
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                ]
            ),
            "JobCompType=jobcomp/none",
            *(
                self.accounting.conf_lines(self.munge_socket)
                if self.accounting is not None
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "SelectType=select/cons_tres",
            # Memory is consumable, with or without cgroups (the same scheduling either way):
            # a job gets its --mem, or DefMemPerCPU per CPU, not the whole node.
            "SelectTypeParameters=CR_CPU_Memory",
            f"DefMemPerCPU={NODE_MEMORY_MB // NODE_CPUS}",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            f"SlurmdTimeout={SLURMD_TIMEOUT}",
            f"KillWait={KILL_WAIT}",
            "InactiveLimit=0",
            # Heterogeneous jobs start from the backfill scheduler only: once a second, not 30.
            "SchedulerParameters=bf_interval=1",
        ]
        for node in self.nodes:
            lines.append(
                f"NodeName={node.name} NodeAddr={node.address} Port={node.port} "
                f"CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} State=UNKNOWN"
            )
        names = ",".join(n.name for n in self.nodes)
        lines.append(
            f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP"
        )
        # The same nodes as a site's partition for people's jobs: root may not run jobs there,
        # so only a pool whose jobs run as their owners' accounts can use it.
        lines.append(
            f"PartitionName={USERS_PARTITION} Nodes={names} MaxTime=INFINITE State=UP "
            "DisableRootJobs=YES"
        )
        lines.append(
            f"PartitionName={FIRST_NODE_PARTITION} Nodes={self.nodes[0].name} "
            "MaxTime=INFINITE State=UP"
        )
        self.conf.write_text("\n".join(lines) + "\n")
        if self.cgroups:
            # Read by slurmd and slurmstepd from slurm.conf's folder. No swap beyond the RAM
            # (AllowedSwapSpace=0): a step past its --mem is OOM-killed, not swapped.
            cgroup_lines = [
                "CgroupPlugin=cgroup/v1",
                f"CgroupMountpoint={self.cgroup_mountpoint}",
                "ConstrainCores=yes",
                "ConstrainRAMSpace=yes",
                "ConstrainSwapSpace=yes",
                "ConstrainDevices=yes",
            ]
            (self.root / "cgroup.conf").write_text("\n".join(cgroup_lines) + "\n")

    def _start_accounting(self, accounting: slurm_accounting.Accounting) -> None:
        accounting.start(
            lambda name, argv, env: self._spawn(name, argv, env),
            self.env(),
            self.munge_socket,
            lambda condition, what: _wait_for(condition, what, self.root),
        )
        accounting.register(self.env(), "trainyard")

    def _start_controller(self) -> None:
        # -i: a fresh state folder has no state files to recover; -D: stay in the foreground.
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)], self.env())

    def stop_controller(self) -> None:
        """slurmctld goes away, as in an outage: the client commands cannot reach it; the jobs
        already running go on (slurmstepd keeps them)."""
        _terminate(self.pids["slurmctld"])

    def start_controller(self) -> None:
        """slurmctld back, from its saved state (the jobs it had, running or queued)."""
        self._start_controller()
        _wait_for(
            lambda: self.command(["sinfo", "-h"], check=False).returncode == 0,
            "slurmctld to answer again",
            self.root,
        )

    def _start_slurmd(self, node: SlurmNode, host: netns.Host | None) -> None:
        argv = ["slurmd", "-D", "-N", node.name, "-f", str(self.conf)]
        if host is not None:
            # Not `ip netns exec`: it remounts /sys, and slurmd then fails on /sys/fs/cgroup.
            # nsenter and unshare exec, so the PID recorded is slurmd's own.
            argv = [
                "nsenter", f"--net=/run/netns/{host.namespace}", "--",
                "unshare", "--uts", "--mount", "--", *argv,
            ]  # fmt: skip
        self._spawn(f"slurmd-{node.name}", argv, self.env())

    def _wait_until_idle(self) -> None:
        def idle() -> bool:
            self._check_alive()
            listed = self.command(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = dict(line.split() for line in listed.stdout.splitlines() if line.strip())
            return len(states) == len(self.nodes) and all(s == "idle" for s in states.values())

        _wait_for(idle, "every slurmd to register as idle", self.root)

    def _check_alive(self) -> None:
        for name, pid in self.pids.items():
            if not _running(pid):
                raise SlurmUnavailable(f"{name} exited at start: see {self.root / 'log'}")

    # -- stopping ---------------------------------------------------------------------------

    def lose_node(self, node_name: str) -> None:
        """The node dies, as a host that loses power does: kill -9 its slurmd and, where it is
        a namespace of its own, everything running on it (a job step's processes)."""
        pid = self.pids.get(f"slurmd-{node_name}")
        if pid and _running(pid):
            os.kill(pid, signal.SIGKILL)
            psutil.Process(pid).wait(STOP_TIMEOUT)
        if self.network is not None:
            index = [n.name for n in self.nodes].index(node_name)
            for other in _pids_in_namespaces([self.network.hosts[index].namespace]):
                _terminate(other, signal.SIGKILL)
        # Its job steps' processes, by their cgroups (on loopback they share this host).
        _end_cgroups([folder / f"slurm_{node_name}" for folder in self.cgroups], remove=False)

    def restore_node(self, node_name: str) -> None:
        """Start the node's slurmd again; Slurm takes it back (ReturnToService=2)."""
        index = [n.name for n in self.nodes].index(node_name)
        self._start_slurmd(self.nodes[index], self.network.hosts[index] if self.network else None)
        self._wait_until_idle()

    def stop(self) -> None:
        """Cancel what still runs, stop the daemons by their recorded PIDs, then end whatever
        is left inside the cluster's namespaces (job steps outlive slurmd) and remove them."""
        if self.pids.get("slurmctld") and _running(self.pids["slurmctld"]):
            for partition in PARTITIONS:
                self.command(["scancel", "--full", f"--partition={partition}"], check=False)
        for name in sorted(self.pids, key=lambda n: n == "munged"):  # munged last
            _terminate(self.pids[name])
        if self.network is not None:
            for pid in _pids_in_namespaces([h.namespace for h in self.network.hosts]):
                _terminate(pid)
            self.network.destroy()
        if self.cgroups:
            _end_cgroups(self.cgroups, remove=True)
            self.cgroups = [folder for folder in self.cgroups if folder.exists()]
            self._write_record()

    def describe(self) -> str:
        where = "network namespaces" if self.network else "this host's loopback"
        nodes = ", ".join(f"{n.name} {n.address}" for n in self.nodes)
        limits = "task/cgroup (cgroup v1)" if self.cgroups else f"no limits ({self.cgroups_off})"
        limits += "; slurmdbd" if self.accounting else f"; no accounting ({self.accounting_off})"
        return (
            f"Slurm: {len(self.nodes)} nodes in {where} ({nodes}); {limits}; SLURM_CONF={self.conf}"
        )


def _wait_for(condition: object, what: str, root: Path, timeout: float = READY_TIMEOUT) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SlurmUnavailable(f"timed out waiting for {what}: see {root / 'log'}")
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _terminate(pid: int, first: int = signal.SIGTERM) -> None:
    """SIGTERM (or `first`), then SIGKILL after STOP_TIMEOUT; reaps it if it is our child."""
    try:
        process = psutil.Process(pid)
        process.send_signal(first)
        process.wait(STOP_TIMEOUT)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        try:
            process.kill()
            process.wait(STOP_TIMEOUT)
        except (psutil.NoSuchProcess, psutil.TimeoutExpired):
            pass


def _end_cgroups(folders: list[Path], remove: bool) -> None:
    """SIGKILL every process in these cgroup folders and their sub-groups (a job step's, which
    slurmstepd may keep after slurmd has gone; only this cluster's are there), then, with
    `remove`, remove the groups, the deepest first. A frozen group is thawed first (a frozen
    process cannot die)."""
    deadline = time.monotonic() + STOP_TIMEOUT
    while True:
        groups = [g for folder in folders if folder.is_dir() for g in _groups_under(folder)]
        pids: set[int] = set()
        for group in groups:
            state = group / "freezer.state"
            if state.exists() and "FROZEN" in _read_text(state):
                try:
                    state.write_text("THAWED")
                except OSError:
                    pass
            pids.update(int(p) for p in _read_text(group / "cgroup.procs").split() if p.isdigit())
        pids.discard(os.getpid())
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    if not remove:
        return
    for folder in folders:
        if not folder.is_dir():
            continue
        for group in sorted(_groups_under(folder), key=lambda g: len(g.parts), reverse=True):
            for _ in range(50):  # a killed process leaves its group a moment after it dies
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _groups_under(folder: Path) -> list[Path]:
    """A cgroup folder and every group below it (cgroupfs has no symlinks; its files are the
    controls)."""
    found = [folder]
    for parent, children, _files in os.walk(folder):
        found.extend(Path(parent) / child for child in children)
    return found


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _pids_in_namespaces(namespaces: list[str]) -> list[int]:
    """Processes whose network namespace is one of ours (a namespace is this cluster's alone)."""
    inodes = set()
    for name in namespaces:
        try:
            inodes.add(os.stat(f"/run/netns/{name}").st_ino)
        except OSError:
            continue
    found = []
    for process in psutil.process_iter():
        try:
            if os.stat(f"/proc/{process.pid}/ns/net").st_ino in inodes:
                found.append(process.pid)
        except OSError:
            continue
    return found


def everyone_may_run(path: str) -> bool:
    """Whether any user may run this file: it and every folder on its way (links followed)
    open to others."""
    real = Path(os.path.realpath(path))
    if not os.stat(real).st_mode & 0o001:
        return False
    return all(os.stat(folder).st_mode & 0o001 for folder in real.parents)


# Where `make people-python` builds it (ignored by git, as .venv is).
PEOPLE_PYTHON = Path(__file__).resolve().parent.parent / ".people-python"


def python_for_everyone(folder: Path = PEOPLE_PYTHON, build: bool = False) -> str:
    """An interpreter with this one's packages that any user may run, for jobs that run as
    people's own accounts (at a site: a shared virtualenv). This one where it is open to all.
    Else (a pyenv under /root, mode 0700, is not) a virtualenv of the system's Python of the
    same minor version in `folder`, reading this virtualenv's packages and this checkout
    through a .pth file; with `build`, made there (pip may fetch what that older patch release
    needs besides: redis-py wants async-timeout below 3.11.3). Raises SlurmUnavailable when
    there is none."""
    if everyone_may_run(sys.executable):
        return sys.executable
    python = folder / "bin" / "python"
    if python.exists():
        return str(python)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not build:
        raise SlurmUnavailable(
            f"{sys.executable} is not open to other users, and {folder} is not built "
            "(make people-python)"
        )
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    if system is None or not everyone_may_run(system):
        raise SlurmUnavailable(
            f"{sys.executable} is not open to other users, and there is no system {version}"
        )
    subprocess.run([system, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = folder / "lib" / version / "site-packages"
    ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    checkout = str(Path(__file__).resolve().parent.parent)
    (site / "trainyard.pth").write_text("\n".join([*ours, checkout]) + "\n")
    older = subprocess.run(
        [str(python), "-c", "import sys; print(int(sys.version_info < (3, 11, 3)))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    if older == "1":
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site)]
        subprocess.run([*pip, "async-timeout>=4.0.3"], check=True)
    for path in (folder, *folder.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return str(python)


def register_pool(cluster: SlurmCluster, name: str) -> bool:
    """Add the cluster to this checkout's console as a Slurm pool (manage.py slurm_pool)."""
    shared = cluster.root / "shared"
    shared.mkdir(exist_ok=True)
    argv = [
        sys.executable, "manage.py", "slurm_pool", name,
        "--partition", PARTITION,
        "--shared-root", str(shared),
        "--python", sys.executable,
        "--slurm-conf", str(cluster.conf),
        "--all-images", "--all-packages", "--check",
    ]  # fmt: skip
    if cluster.network is not None:
        # The nodes reach this machine's Redis across the bridge; `make run`'s Redis listens
        # on loopback only, so this needs a console whose Redis listens there too.
        argv += ["--redis-host", cluster.controller_address]
    done = subprocess.run(argv, cwd=Path(__file__).resolve().parent.parent, check=False)
    if done.returncode == 0:
        print(f"New job → Run on: Slurm pool {name}", flush=True)
    return done.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stack.slurm",
        description="Start a three-node Slurm cluster on this machine; Ctrl-C stops it.",
    )
    parser.add_argument("--root", type=Path, help="its folder (default: a new one under /tmp)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument(
        "--one-host", action="store_true", help="no network namespaces: slurmd on loopback"
    )
    parser.add_argument(
        "--no-cgroups",
        action="store_true",
        help="no task/cgroup (proctrack/linuxproc, task/none): no limits on jobs",
    )
    parser.add_argument(
        "--people-python",
        action="store_true",
        help=f"only build {PEOPLE_PYTHON.name}, a Python any user may run (python_for_everyone)",
    )
    parser.add_argument(
        "--pool",
        metavar="NAME",
        help="also add it to the console in this checkout (var/, as `make run` uses) as a "
        "Slurm pool of this name offering every image and package",
    )
    args = parser.parse_args(argv)
    if args.people_python:
        try:
            print(python_for_everyone(build=True))
        except (SlurmUnavailable, subprocess.CalledProcessError) as exc:
            print(f"no Python for everyone: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        cluster = SlurmCluster.start(
            args.root,
            args.nodes,
            use_namespaces=False if args.one_host else None,
            cgroups=False if args.no_cgroups else None,
        )
    except SlurmUnavailable as exc:
        print(f"Slurm could not start: {exc}", file=sys.stderr)
        return 1
    print(cluster.describe(), flush=True)
    print(f"Try it:  SLURM_CONF={cluster.conf} srun -N{len(cluster.nodes)} hostname -I", flush=True)
    if args.pool and not register_pool(cluster, args.pool):
        cluster.stop()
        return 1
    stopping: list[int] = []
    # Both set here: a shell that starts this in the background leaves SIGINT ignored.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda number, frame: stopping.append(number))
    while not stopping:
        signal.pause()
    cluster.stop()
    print("Slurm stopped.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
