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

What the set-up leaves out, as a small site without them does: cgroups (proctrack/linuxproc),
accounting (no slurmdbd, so no `sacct`) and PMIx. munged runs as the `munge` user with its
socket in a folder of mode 755; slurmctld and slurmd run as root, as at a real site.

Every process is started with an argv list, never a shell, and its PID goes into
`<root>/pids.json`; stop() signals exactly those PIDs, then anything still running inside the
cluster's own network namespaces (a job step's processes, which slurmstepd keeps after slurmd
has gone), and removes the namespaces.
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

from stack import netns
from stack.redis_server import free_port
from workers import deathsig

PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "srun")
MUNGE_USER = "munge"
PARTITION = "trainyard"
# Each node's size: every node advertises this much, whatever the machine has; Slurm only
# checks that the machine has at least as much (it reports the whole machine to every slurmd).
NODE_CPUS = 2
NODE_MEMORY_MB = 16000
# Seconds: how long slurmctld waits for a silent slurmd before it marks the node DOWN and fails
# the jobs on it (NODE_FAIL). Slurm's default is 300; a test of a lost node should not wait that.
SLURMD_TIMEOUT = 10
# How long a job's processes have between scancel's SIGTERM and its SIGKILL (Slurm: KillWait).
KILL_WAIT = 15
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


class SlurmUnavailable(RuntimeError):
    """Slurm cannot run here; the message says why in one line."""


def unavailable_reason() -> str | None:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing): "
            f"apt-get install {' '.join(PACKAGES)}"
        )
    try:
        pwd.getpwnam(MUNGE_USER)
    except KeyError:
        return "there is no 'munge' user (Debian's munge package makes it)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs as their users"
    return None


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

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket.2"

    @property
    def partition(self) -> str:
        return PARTITION

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
        cls, root: Path | None = None, nodes: int = 3, use_namespaces: bool | None = None
    ) -> "SlurmCluster":
        reason = unavailable_reason()
        if reason:
            raise SlurmUnavailable(reason)
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
        )
        try:
            cluster._start_munge()
            cluster._write_conf()
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
        record = {"pids": self.pids, "network": self.network.tag if self.network else None}
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
        # The death signal after setpriv: a change of uid clears one set before it.
        self._spawn(
            "munged",
            [
                "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                *deathsig.command([]), "munged", "--foreground",
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
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
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
        self.conf.write_text("\n".join(lines) + "\n")

    def _start_controller(self) -> None:
        # -i: a fresh state folder has no state files to recover; -D: stay in the foreground.
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)], self.env())

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

    def restore_node(self, node_name: str) -> None:
        """Start the node's slurmd again; Slurm takes it back (ReturnToService=2)."""
        index = [n.name for n in self.nodes].index(node_name)
        self._start_slurmd(self.nodes[index], self.network.hosts[index] if self.network else None)
        self._wait_until_idle()

    def stop(self) -> None:
        """Cancel what still runs, stop the daemons by their recorded PIDs, then end whatever
        is left inside the cluster's namespaces (job steps outlive slurmd) and remove them."""
        if self.pids.get("slurmctld") and _running(self.pids["slurmctld"]):
            self.command(["scancel", "--full", f"--partition={PARTITION}"], check=False)
        for name in sorted(self.pids, key=lambda n: n == "munged"):  # munged last
            _terminate(self.pids[name])
        if self.network is not None:
            for pid in _pids_in_namespaces([h.namespace for h in self.network.hosts]):
                _terminate(pid)
            self.network.destroy()

    def describe(self) -> str:
        where = "network namespaces" if self.network else "this host's loopback"
        nodes = ", ".join(f"{n.name} {n.address}" for n in self.nodes)
        return f"Slurm: {len(self.nodes)} nodes in {where} ({nodes}); SLURM_CONF={self.conf}"


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
        "--pool",
        metavar="NAME",
        help="also add it to the console in this checkout (var/, as `make run` uses) as a "
        "Slurm pool of this name offering every image and package",
    )
    args = parser.parse_args(argv)
    try:
        cluster = SlurmCluster.start(
            args.root, args.nodes, use_namespaces=False if args.one_host else None
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
