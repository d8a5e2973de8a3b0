"""Hosts on one machine: each node agent in a Linux network namespace of its own.

    network = HostNetwork.create(3)      # a bridge, and 3 namespaces with an address each
    network.hosts[0].run_argv([...])     # an argv that runs inside the first "host"
    network.cut(network.hosts[2])        # its link goes down: the host drops off the network
    network.destroy()

The bridge holds the first address of a private /24 on this side (the console's hosts reach
Redis there); every namespace gets its own address on the bridge through a veth pair, its own
loopback, and nothing else. A trainer started in a namespace can reach the other namespaces
only across the bridge, so a job whose instances span them sends its gloo traffic between
real addresses, as it does between real hosts.

It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`; `unavailable_reason()`
says in one line why it cannot run. Every command is an argv list, never a shell. The names
carry a tag of this run (the bridge `tyb<tag>`, namespaces `trainyard-<tag>-node-N`), so two
runs on one machine never touch each other's; destroy() removes exactly what create() made.
"""

import ipaddress
import os
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil

IP = "ip"
# Inside a namespace the interface on the bridge is called this, on every host alike.
HOST_INTERFACE = "eth0"
# Files here replace /etc's under `ip netns exec NAME` (iproute2's convention).
NETNS_ETC = Path("/etc/netns")
# The /24s tried, in order, for the bridge: 10.231.N.0/24 for N in this range, the first one
# no interface of this machine overlaps.
SUBNET_PREFIX = "10.231"
_SAFE_TAG = re.compile(r"[0-9a-f]{1,12}")


@dataclass(frozen=True)
class Host:
    """One namespace: a "host" with one address on the bridge."""

    node: str  # the node agent's name
    namespace: str
    address: str
    veth: str  # the host side of its veth pair, on the bridge
    interface: str = HOST_INTERFACE

    def run_argv(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's namespace (`ip netns exec` execs it, and so does
        stack/nscgroups.py, which mounts the machine's cgroups again in the fresh /sys
        `ip netns exec` gives: same PID)."""
        return [_ip(), "netns", "exec", self.namespace, *_with_cgroups(argv)]


@dataclass
class HostNetwork:
    tag: str
    bridge: str
    subnet: ipaddress.IPv4Network
    hosts: list[Host] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        """The bridge's address: where the hosts reach this machine (Redis, the web server)."""
        return str(next(self.subnet.hosts()))

    @classmethod
    def create(cls, nodes: int, tag: str | None = None) -> "HostNetwork":
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        tag = tag or new_tag()
        network = cls(tag=tag, bridge=f"tyb{tag}", subnet=_free_subnet())
        try:
            network._make_bridge()
            for i in range(1, nodes + 1):
                network.hosts.append(network._make_host(i))
            network._write_hosts_files()
        except BaseException:
            network.destroy()
            raise
        return network

    def _make_bridge(self) -> None:
        _run("link", "add", self.bridge, "type", "bridge")
        _run("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _run("link", "set", self.bridge, "up")

    def _make_host(self, i: int) -> Host:
        node = f"node-{i}"
        host = Host(
            node=node,
            namespace=f"trainyard-{self.tag}-{node}",
            address=str(self.subnet.network_address + 10 + i),
            veth=f"tyv{self.tag}n{i}",
        )
        _run("netns", "add", host.namespace)
        _run(
            "link", "add", host.veth, "type", "veth",
            "peer", "name", host.interface, "netns", host.namespace,
        )  # fmt: skip
        _run("link", "set", host.veth, "master", self.bridge, "up")
        inside = ["-n", host.namespace]
        _run(
            *inside, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", host.interface
        )
        _run(*inside, "link", "set", host.interface, "up")
        _run(*inside, "link", "set", "lo", "up")
        return host

    def _write_hosts_files(self) -> None:
        """Names for every address, as a cluster's DNS gives them: torch's c10d looks up the
        name of each peer's address and warns on every connection when it finds none.
        `ip netns exec` shows /etc/netns/NAME/hosts as the namespace's /etc/hosts."""
        lines = ["127.0.0.1 localhost", f"{self.gateway} trainyard-console"]
        lines += [f"{h.address} {h.node}" for h in self.hosts]
        for host in self.hosts:
            folder = NETNS_ETC / host.namespace
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text("\n".join(lines) + "\n")

    def cut(self, host: Host) -> None:
        """Take the host off the network, as a pulled cable does: its processes live on."""
        _run("link", "set", host.veth, "down")

    def mend(self, host: Host) -> None:
        _run("link", "set", host.veth, "up")

    def destroy(self) -> None:
        """Remove the namespaces (their veth pairs go with them) and the bridge. Processes
        still inside a namespace keep it alive until they end: stop them first."""
        for host in self.hosts:
            _run("netns", "delete", host.namespace, check=False)
            shutil.rmtree(NETNS_ETC / host.namespace, ignore_errors=True)
        _run("link", "delete", self.bridge, check=False)
        self.hosts.clear()


def new_tag() -> str:
    """A tag for the names of one run's network (a record can name it before it exists)."""
    return secrets.token_hex(3)


def remove_leftovers(tag: str) -> list[str]:
    """Remove what a run tagged `tag` made and did not remove (it was killed with SIGKILL):
    its namespaces, their /etc/netns folders and its bridge. One line per thing removed."""
    if not _SAFE_TAG.fullmatch(tag):
        return []  # not a tag create() makes: nothing of ours
    if unavailable_reason() is not None:
        return [f"not removed (needs root): network namespaces trainyard-{tag}-*, bridge tyb{tag}"]
    removed = []
    listed = subprocess.run(
        [_ip(), "netns", "list"], capture_output=True, text=True, check=False
    ).stdout
    for line in listed.splitlines():
        name = line.split(" ", 1)[0]
        if name.startswith(f"trainyard-{tag}-"):
            _run("netns", "delete", name, check=False)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
            removed.append(f"network namespace {name}")
    bridge = f"tyb{tag}"
    if Path("/sys/class/net", bridge).exists():
        _run("link", "delete", bridge, check=False)
        removed.append(f"bridge {bridge}")
    return removed


def unavailable_reason() -> str | None:
    """Why hosts in network namespaces cannot be made here, in one line; None if they can."""
    if os.geteuid() != 0:
        return "hosts in network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    if shutil.which(IP) is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    if not Path("/proc/self/ns/net").exists():
        return "this kernel has no network namespaces"
    probe = f"trainyard-probe-{os.getpid()}"
    made = subprocess.run(
        [_ip(), "netns", "add", probe], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run([_ip(), "netns", "delete", probe], capture_output=True, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    taken = [
        ipaddress.ip_interface(f"{a.address}/{a.netmask}").network
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family.name == "AF_INET" and a.netmask
    ]
    start = os.getpid() % 200  # runs beside each other start their search in different places
    for offset in range(250):
        candidate = ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{(start + offset) % 250}.0/24")
        if not any(candidate.overlaps(t) for t in taken):
            return candidate
    raise RuntimeError(f"no free /24 under {SUBNET_PREFIX}.0.0/16 for the hosts' bridge")


def _ip() -> str:
    found = shutil.which(IP)
    if found is None:
        raise RuntimeError("iproute2's `ip` is not installed")
    return found


def _run(*args: str, check: bool = True) -> None:
    result = subprocess.run([_ip(), *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def _with_cgroups(argv: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", str(Path(__file__).with_name("nscgroups.py")), "--", *argv]
