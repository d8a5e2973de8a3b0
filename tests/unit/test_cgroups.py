"""workers/cgroups.py on fake hierarchies (folders of plain files laid out as the kernel lays
out cgroup v1 and v2), and on this host's real one where there is one: where the groups go,
what limits are written, how the counters and the causes of an end are read; and
workers/limits.py's reasons. The real stack's jobs are held to them in
tests/integration/test_instance_limits.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers import cgroups, deathsig, limits
from workers.spec import ReplicaSpec

V2_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, str]]:
    """The kernel's part of a fake hierarchy: a write to a control file keeps the value (the
    last one: rules the kernel appends, as devices.allow's, are in the list)."""
    writes: list[tuple[Path, str]] = []

    def write(path: Path, value: str) -> None:
        writes.append((path, value))
        path.write_text(value)

    monkeypatch.setattr(cgroups, "_write", write)
    return writes


def v2_host(tmp_path: Path, own: str = "/") -> tuple[str, str, Path]:
    """A cgroup2 mount at tmp_path/unified, this process in `own`: (mountinfo, cgroup, root)."""
    root = tmp_path / "unified"
    (root / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(V2_CONTROLLERS + "\n")
    mountinfo = f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n"
    return mountinfo, f"0::{own}\n", root


def v1_host(tmp_path: Path, memory_own: str = "/") -> tuple[str, str, Path]:
    lines, memberships = [], []
    for k, controller in enumerate(("cpu", "cpuacct", "memory", "pids", "devices", "cpuset")):
        point = tmp_path / controller
        point.mkdir()
        lines.append(
            f"{32 + k} 31 0:{29 + k} / {point} rw,relatime - cgroup cgroup rw,{controller}"
        )
        own = memory_own if controller == "memory" else "/"
        (point / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
        memberships.append(f"{9 - k}:{controller}:{own}")
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-3\n")
    (tmp_path / "cpuset" / "cpuset.mems").write_text("0\n")
    return "\n".join(lines) + "\n", "\n".join(memberships) + "\n", tmp_path


REQUEST = cgroups.Request(
    memory_bytes=2 << 30,
    cpus=1.5,
    max_processes=256,
    devices=((195, 0), (195, 255)),
    cores=(1, 2),
)


def test_v2_groups_go_below_the_agents_own_cgroup_with_their_limits(
    tmp_path: Path, written: list[tuple[Path, str]]
) -> None:
    mountinfo, proc, root = v2_host(tmp_path, "/agents.slice/trainyard.service")
    found = cgroups.probe(
        "node-1", "/var/agents", mountinfo=mountinfo, proc_cgroup=proc, try_it=False
    )
    assert found.layout is cgroups.Layout.V2 and found.enforced
    ((_, node_root),) = found.roots
    assert node_root.parent == root / "agents.slice/trainyard.service"
    assert node_root.name.startswith("trainyard-node-1-")
    # Controllers are handed down to the node's folder and from it to the instances.
    enabled = "+memory +cpu +pids +cpuset"
    assert (node_root.parent / "cgroup.subtree_control").read_text() == enabled
    assert (node_root / "cgroup.subtree_control").read_text() == enabled
    made = found.create("42-0-worker-1", REQUEST)
    folder = made.folders[""]
    assert folder.parent == node_root
    assert (folder / "memory.max").read_text() == str(2 << 30)
    assert (folder / "cpu.max").read_text() == "150000 100000"
    assert (folder / "pids.max").read_text() == "256"
    # Files the kernel makes in every new group (a fake one has them made by hand): no swap
    # beyond the memory, and one OOM kill ends the whole instance.
    for name in ("memory.swap.max", "memory.oom.group"):
        (folder / name).write_text("max\n")
    cgroups._limit_v2(folder, REQUEST)
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "memory.oom.group").read_text() == "1"
    assert made.procs_files() == [str(folder / "cgroup.procs")]


def test_v2_counters_and_causes_are_read_from_the_groups_files(
    tmp_path: Path, written: list[tuple[Path, str]]
) -> None:
    mountinfo, proc, _ = v2_host(tmp_path)
    found = cgroups.probe("n", "/w", mountinfo=mountinfo, proc_cgroup=proc, try_it=False)
    group = found.group("7-1-master")
    folder = group.folders[""]
    folder.mkdir()
    (folder / "cpu.stat").write_text(
        "usage_usec 12500000\nuser_usec 10000000\nsystem_usec 2500000\n"
    )
    (folder / "memory.peak").write_text(f"{3 << 30}\n")
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    (folder / "pids.events").write_text("max 0\n")
    assert group.usage() == cgroups.Usage(
        cpu_seconds=12.5, memory_peak_bytes=3 << 30, oom_kills=1, process_limit_hits=0
    )
    # Before Linux 5.19 there is no memory.peak: what is in use now is the best known.
    (folder / "memory.peak").unlink()
    (folder / "memory.current").write_text("1024\n")
    assert group.usage().memory_peak_bytes == 1024


def test_v2_an_agent_in_a_cgroup_with_processes_moves_to_a_leaf_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v2 lets a cgroup give controllers to children only when it holds no process itself."""
    mountinfo, proc, root = v2_host(tmp_path, "/session")
    parent = root / "session"
    writes: list[tuple[Path, str]] = []

    def kernel_like(path: Path, value: str) -> None:
        if path == parent / "cgroup.subtree_control" and not writes:
            raise OSError(16, "Device or resource busy")  # this agent is still in there
        writes.append((path, value))
        path.write_text(value)

    monkeypatch.setattr(cgroups, "_write", kernel_like)
    found = cgroups.probe("n", "/w", mountinfo=mountinfo, proc_cgroup=proc, try_it=False)
    assert found.enforced
    assert writes[0] == (parent / "trainyard-agent" / "cgroup.procs", str(os.getpid()))
    assert writes[1] == (parent / "cgroup.subtree_control", "+memory +cpu +pids +cpuset")


def test_v2_without_its_controllers_says_why(tmp_path: Path) -> None:
    """This project's CI hosts: an empty cgroup2 beside the v1 hierarchies."""
    mountinfo, proc, root = v2_host(tmp_path)
    (root / "cgroup.controllers").write_text("\n")
    found = cgroups.probe("n", "/w", mountinfo=mountinfo, proc_cgroup=proc, try_it=False)
    assert not found.enforced
    assert "has no memory, cpu, pids controller" in found.reason


def test_v1_groups_go_in_every_hierarchy_below_the_agents_place_there(
    tmp_path: Path, written: list[tuple[Path, str]]
) -> None:
    mountinfo, proc, root = v1_host(tmp_path, memory_own="/process_api/abc")
    found = cgroups.probe("node-1", "/w", mountinfo=mountinfo, proc_cgroup=proc, try_it=False)
    assert found.layout is cgroups.Layout.V1 and found.devices
    roots = dict(found.roots)
    assert roots["memory"].parent == root / "memory/process_api/abc"
    assert roots["cpu"].parent == root / "cpu"
    made = found.create("9-0-master", REQUEST)
    assert made.folders["memory"].parent == roots["memory"]
    (made.folders["memory"] / "memory.memsw.limit_in_bytes").write_text("")
    cgroups._limit_v1(made.folders, REQUEST, devices=True)
    memory = made.folders["memory"]
    assert (memory / "memory.limit_in_bytes").read_text() == str(2 << 30)
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == str(2 << 30)
    assert (made.folders["cpu"] / "cpu.cfs_quota_us").read_text() == "150000"
    assert (made.folders["pids"] / "pids.max").read_text() == "256"
    # The node's folder took its parent's cores; the instance has the ones it was given.
    assert found.cores == (0, 1, 2, 3) and found.mems == "0"
    assert (made.folders["cpuset"] / "cpuset.cpus").read_text() == "1,2"
    assert (made.folders["cpuset"] / "cpuset.mems").read_text() == "0"
    shared = found.create("9-0-worker-0", cgroups.Request(cpus=2))
    assert (shared.folders["cpuset"] / "cpuset.cpus").read_text() == "0,1,2,3"
    devices = made.folders["devices"]
    rules = [value for path, value in written if path.parent == devices]
    # Everything denied, then the basic devices and the instance's own GPUs allowed.
    assert rules[0] == "a" and "c 1:3 rwm" in rules and "c 136:* rwm" in rules
    assert rules[-2:] == ["c 195:0 rwm", "c 195:255 rwm"]


def test_a_node_that_advertises_more_cores_than_it_has_gives_none_of_its_own(
    tmp_path: Path, written: list[tuple[Path, str]]
) -> None:
    """Two agents on one 4-core host, each advertising 4: each would pin its first instance to
    core 3. They share the cores under their quotas instead."""
    mountinfo, proc, _ = v1_host(tmp_path)
    found = cgroups.probe("n", "/w", mountinfo=mountinfo, proc_cgroup=proc, try_it=False)
    assert found.sharing_cores(4) is found
    shared = found.sharing_cores(8)
    assert shared.cores == () and "cpuset" not in dict(shared.roots)
    assert shared.reason.endswith("(cores shared: the node advertises 8, it has 4)")
    assert "dedicated cores" not in shared.reason
    group = shared.create("1-0-master", cgroups.Request(cpus=2))
    assert "cpuset" not in group.folders
    # The node's cpuset folder, made by the probe and unused, goes when the agent stops too
    # (every `make run` and test stack left one behind).
    cpuset_root = dict(found.roots)["cpuset"]
    for control in cpuset_root.iterdir():  # a fake's files (the kernel's do not stop rmdir)
        control.unlink()
    shared.remove_node_folders()
    assert not cpuset_root.exists()


def test_a_cpu_list_reads_as_the_kernel_writes_it() -> None:
    assert cgroups.parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert cgroups.parse_cpu_list("") == ()
    assert cgroups.cpu_list([3, 1, 2]) == "1,2,3"


def test_without_cgroups_the_reason_is_plain() -> None:
    assert cgroups.probe("n", wanted=False).reason == "limits were turned off (--no-limits)"
    found = cgroups.probe("n", mountinfo="", proc_cgroup="")
    assert (found.enforced, found.reason) == (False, "no cgroup file system is mounted")


def test_a_group_name_that_could_leave_its_folder_is_refused(tmp_path: Path) -> None:
    mountinfo, proc, _ = v2_host(tmp_path)
    found = cgroups.probe("n", "/w", mountinfo=mountinfo, proc_cgroup=proc, try_it=False)
    with pytest.raises(cgroups.CgroupError):
        found.group("../../escape")


def spec(**fields: object) -> ReplicaSpec:
    values: dict[str, object] = {
        "job_id": 3, "role": "master", "index": 0, "node": "n", "framework": "pytorch",
        "program": {"script": "t.py"}, "args": [], "master_addr": "127.0.0.1",
        "hosts_rendezvous": True, "world_size": 1, "node_rank": 0, "rank_offset": 0,
        "local_world_size": 1, "cpus": 1, "gpus": 0, "package": "cpu-1", "memory_gb": 2,
        "max_processes": 64,
    }  # fmt: skip
    values.update(fields)
    return ReplicaSpec(**values)  # type: ignore[arg-type]


def test_the_reasons_name_the_limit_the_use_and_the_package() -> None:
    oom = cgroups.Usage(cpu_seconds=1, memory_peak_bytes=2 << 30, oom_kills=1)
    assert limits.end_reason(spec(), oom) == "out of memory: used 2.0 of 2 GB (package cpu-1)"
    forks = cgroups.Usage(process_limit_hits=3)
    assert limits.end_reason(spec(), forks) == "process limit of 64 reached (package cpu-1)"
    assert limits.end_reason(spec(), cgroups.Usage(cpu_seconds=5)) is None
    use = limits.DiskUse(used_bytes=60 << 20, limit_bytes=50 << 20)
    assert use.over and limits.disk_reason(spec(), use) == (
        "disk limit reached: the job's working folder, checkpoints and instance folders hold "
        "60 MB of 50 MB (package cpu-1)"
    )
    assert limits.request_for(spec(), ["/dev/null", "/dev/nonexistent"]) == cgroups.Request(
        memory_bytes=2 << 30, cpus=1.0, max_processes=64, devices=((1, 3),)
    )


def test_the_disk_is_measured_as_the_jobs_uid_and_follows_no_link(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "data").write_bytes(b"x" * (3 << 20))
    os.link(job / "data", job / "same-data")  # one inode: counted once
    (job / "to-root").symlink_to("/usr")  # never followed
    os.mkfifo(job / "fifo")  # never opened
    (job / "sparse").open("wb").truncate(1 << 40)  # a terabyte of holes: no blocks
    use = limits.disk_use([job, tmp_path / "not-made-yet"], 1, os.getuid())
    assert use is not None
    assert 3 << 20 <= use.used_bytes < 4 << 20, use


def test_a_file_removed_but_held_open_still_counts(tmp_path: Path) -> None:
    """du counts names; a job could fill the disk with files it removed and keeps open."""
    held = tmp_path / "held"
    with held.open("wb") as out:
        out.write(b"x" * (2 << 20))
        out.flush()
        os.fsync(out.fileno())
        assert limits.unlinked_bytes([os.getpid()]) == 0  # still named: du counts it
        held.unlink()
        assert limits.unlinked_bytes([os.getpid(), 2**22 + 1]) >= 2 << 20


def test_the_shim_joins_the_groups_before_the_program_starts(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    argv = deathsig.command(
        [sys.executable, "-c", "import os; print(os.getpid())"], cgroups=[str(procs)]
    )
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert procs.read_text() == done.stdout.strip()


def test_the_shim_starts_nothing_when_it_cannot_join(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    argv = deathsig.command(
        ["touch", str(marker)], cgroups=[str(tmp_path / "no-such-group" / "cgroup.procs")]
    )
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == deathsig.EXIT_NO_CGROUP
    assert "cannot join cgroup" in done.stderr and not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make cgroups")
def test_on_this_host_a_group_holds_a_process_to_its_memory(tmp_path: Path) -> None:
    found = cgroups.probe("unit-test", str(tmp_path))
    if not found.enforced:
        pytest.skip(f"SKIPPED, not run: {found.reason}")
    group = found.create("1-0-master", cgroups.Request(memory_bytes=64 << 20, max_processes=16))
    try:
        hog = "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096])"
        argv = deathsig.command([sys.executable, "-c", hog], cgroups=group.procs_files())
        done = subprocess.run(argv, capture_output=True, check=False)
        assert done.returncode == -9
        usage = group.usage()
        assert usage.oom_kills >= 1 and usage.memory_peak_bytes <= 64 << 20
    finally:
        assert group.remove()
        found.remove_node_folders()


def test_a_slurm_steps_use_is_read_from_the_groups_its_task_cgroup_made(tmp_path: Path) -> None:
    """The step wrapper's own groups, as Slurm 22.05's cgroup/v1 plugin names them; the OOM
    kill counted where Slurm set the limit (the job's group)."""
    job = "slurm_node-1/uid_1900000003/job_42"
    mountinfo = "".join(
        f"3{k} 31 0:3{k} / {tmp_path / c} rw - cgroup cgroup rw,{c}\n"
        for k, c in enumerate(("cpuacct", "memory"))
    )
    proc = f"2:cpuacct:/{job}/step_0/task_0\n4:memory:/{job}/step_0/task_0\n"
    cpu, memory = (tmp_path / c / job / "step_0" / "task_0" for c in ("cpuacct", "memory"))
    for folder in (cpu, memory):
        folder.mkdir(parents=True)
    (cpu / "cpuacct.usage").write_text("7500000000\n")
    (memory / "memory.max_usage_in_bytes").write_text(f"{1 << 30}\n")
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (tmp_path / "memory" / job / "memory.oom_control").write_text("oom_kill 1\n")
    found = cgroups.slurm_step_usage(mountinfo, proc)
    assert found == cgroups.Usage(cpu_seconds=7.5, memory_peak_bytes=1 << 30, oom_kills=1)
    # proctrack/linuxproc: the wrapper is in no step group, so no counters are the step's.
    assert cgroups.slurm_step_usage(mountinfo, "2:cpuacct:/\n4:memory:/user.slice\n") is None


def test_v1_containers_groups_are_at_one_path_in_every_hierarchy(
    tmp_path: Path, written: list[tuple[Path, str]]
) -> None:
    """A runtime takes one --cgroup-parent for all hierarchies, and this agent's place differs
    between them (memory's is /process_api/abc): the containers' groups go at the same path
    in each, the package written on them, the runtime's own device rules left to it."""
    mountinfo, proc, root = v1_host(tmp_path, memory_own="/process_api/abc")
    (tmp_path / "freezer").mkdir()
    mountinfo += f"40 31 0:40 / {tmp_path / 'freezer'} rw,relatime - cgroup cgroup rw,freezer\n"
    found = cgroups.probe("node-1", "/w", mountinfo=mountinfo, proc_cgroup=proc, try_it=False)
    twin = found.containers
    assert twin is not None and twin.nested
    assert twin.path.startswith("/trainyard-containers/trainyard-node-1-")
    made = twin.create("9-0-master", REQUEST)
    path = twin.path_of("9-0-master")
    assert made.nested and made.folders["memory"] == root / "memory" / path.lstrip("/")
    assert made.folders["other:" + str(tmp_path / "freezer")] == tmp_path / "freezer" / path[1:]
    assert (made.folders["memory"] / "memory.limit_in_bytes").read_text() == str(2 << 30)
    assert (made.folders["pids"] / "pids.max").read_text() == "256"
    assert (made.folders["cpuset"] / "cpuset.cpus").read_text() == "1,2"
    assert not [p for p, _ in written if p.parent == made.folders["devices"]]
    # Without cores of its own, a nested group still names the node's (a v1 runtime's child
    # copies them from it).
    shared = twin.create("9-0-worker-0", cgroups.Request(cpus=1))
    assert (shared.folders["cpuset"] / "cpuset.cpus").read_text() == "0,1,2,3"


def fake_runtime_child(group: cgroups.InstanceGroup) -> None:
    """What runc and conmon leave below a nested group after their container has ended."""
    for folder in group.folders.values():
        (folder / "conmon").mkdir(parents=True)


def test_a_nested_groups_limits_reached_are_read_as_what_ended_its_containers(
    tmp_path: Path, written: list[tuple[Path, str]]
) -> None:
    mountinfo, proc, _ = v1_host(tmp_path)
    found = cgroups.probe("n", "/w", mountinfo=mountinfo, proc_cgroup=proc, try_it=False)
    assert found.containers is not None
    group = found.containers.group("3-0-master")
    memory, pids = group.folders["memory"], group.folders["pids"]
    for folder in group.folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    (group.folders["cpuacct"] / "cpuacct.usage").write_text("2500000000\n")
    (memory / "memory.limit_in_bytes").write_text(f"{1 << 30}\n")
    (memory / "memory.max_usage_in_bytes").write_text(f"{600 << 20}\n")
    (pids / "pids.max").write_text("64\n")
    (pids / "pids.peak").write_text("12\n")
    assert group.usage() == cgroups.Usage(cpu_seconds=2.5, memory_peak_bytes=600 << 20)
    # At the limit: the containers' own groups counted the kill, and they are gone.
    (memory / "memory.max_usage_in_bytes").write_text(f"{1 << 30}\n")
    (pids / "pids.peak").write_text("64\n")
    assert group.usage() == cgroups.Usage(2.5, 1 << 30, oom_kills=1, process_limit_hits=1)
    # An instance group of its own processes counts its events itself: no inference there.
    plain = cgroups.InstanceGroup(group.layout, group.folders)
    assert plain.usage().oom_kills == 0 and plain.usage().process_limit_hits == 0
    # What the runtime left below goes with it (the group's own rmdir is the kernel's: a
    # fake one's folder holds files, which a real group's never stop).
    fake_runtime_child(group)
    group.remove()
    assert not any((f / "conmon").exists() for f in group.folders.values())


def test_a_nested_groups_use_now_is_its_cpu_time_and_working_set(tmp_path: Path) -> None:
    folder = tmp_path / "memory"
    cpu = tmp_path / "cpuacct"
    for f in (folder, cpu):
        f.mkdir()
    (cpu / "cpuacct.usage").write_text("1500000000\n")
    (folder / "memory.usage_in_bytes").write_text(f"{500 << 20}\n")
    (folder / "memory.stat").write_text(f"cache 1\ntotal_inactive_file {100 << 20}\n")
    group = cgroups.InstanceGroup(cgroups.Layout.V1, {"memory": folder, "cpuacct": cpu}, True)
    assert group.now() == (1.5, 400 << 20)
    (folder / "child").mkdir()
    (folder / "child" / "cgroup.procs").write_text("41\n42\n")
    assert group.pids() == [41, 42]  # the processes of the runtime's groups below


def test_v2_containers_groups_go_beside_the_nodes_folder(
    tmp_path: Path, written: list[tuple[Path, str]]
) -> None:
    mountinfo, proc, _ = v2_host(tmp_path, "/agents.slice/trainyard.service")
    found = cgroups.probe("node-1", "/w", mountinfo=mountinfo, proc_cgroup=proc, try_it=False)
    twin = found.containers
    assert twin is not None
    ((_, node_root),) = found.roots
    ((_, folder),) = twin.roots
    assert folder == node_root.with_name(node_root.name + "-containers")
    assert twin.path == f"/agents.slice/trainyard.service/{folder.name}"
    made = twin.create("5-0-master", REQUEST)
    assert (made.folders[""] / "memory.max").read_text() == str(2 << 30)
    # The runtime's groups below it get the controllers.
    assert (made.folders[""] / "cgroup.subtree_control").read_text() == (
        "+memory +cpu +pids +cpuset"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make cgroups")
def test_on_this_host_a_nested_group_holds_and_counts_what_ran_below_it(tmp_path: Path) -> None:
    """As a container runtime does: a process in a child group of the instance's, which goes
    once the process has ended; the instance's group still knows the CPU time, the peak and
    that its limit killed it."""
    found = cgroups.probe("unit-test", str(tmp_path))
    if not found.enforced or found.containers is None:
        pytest.skip(f"SKIPPED, not run: {found.reason}")
    group = found.containers.create("1-0-master", cgroups.Request(memory_bytes=64 << 20))
    try:
        child = {key: folder / "libpod-test" for key, folder in group.folders.items()}
        for folder in child.values():
            folder.mkdir()
        if "cpuset" in child:
            for name in ("cpuset.cpus", "cpuset.mems"):
                (child["cpuset"] / name).write_text((group.folders["cpuset"] / name).read_text())
        hog = (
            "import time; t = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\n"
            "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096])"
        )
        procs = sorted({str(f / "cgroup.procs") for f in child.values()})
        done = subprocess.run(
            deathsig.command([sys.executable, "-c", hog], cgroups=procs), capture_output=True
        )
        assert done.returncode == -9
        for folder in child.values():
            folder.rmdir()
        usage = group.usage()
        assert usage.cpu_seconds >= 0.3 and usage.memory_peak_bytes == 64 << 20
        assert usage.oom_kills == 1
    finally:
        assert group.remove()
        found.remove_node_folders()
