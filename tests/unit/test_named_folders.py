"""Folders a job names by path, and trainers that run as their owner's own Unix identity
(workers/folderaccess.py, workers/unixids.py), on a real node: real bubblewrap sandboxes, real
setpriv, a real team folder tree made as a site makes it (a data set of group `vision`, mode
0750; a results folder of the person's).

- the kernel (asked as the person) and the permission bits (the console's check) agree on who
  may read and write a team's folders;
- a folder some non-root user could swap between the check and the bind is refused, as is
  any of the agent's own folders, the whole file system, and a name not in its plain form;
- a job of a person in the group reads the data set (and cannot change it), writes its result,
  and what it wrote, its checkpoint included, carries their uid and gid; a job of a person out
  of the group fails before any of it starts, saying why; a job sent with uid 0 never starts.
"""

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import required_here
from tests.unit import test_sandbox
from tests.unit.test_supervisor import Reports, spec, texts
from workers import contract, folderaccess, unixids
from workers.folderaccess import FolderRefused
from workers.supervisor import Supervisor

# The sandbox tests' real node, with its Redis and its reports.
client, reports, host_sandbox, node = (
    test_sandbox.client,
    test_sandbox.reports,
    test_sandbox.host_sandbox,
    test_sandbox.node,
)
VISION = 30001
ADA = unixids.own_user(20001, 20001, [30000, VISION])  # in the group vision
GRACE = unixids.own_user(20002, 20002, [30000])  # not in it


@dataclass(frozen=True)
class TeamTree:
    base: Path
    vision: Path  # the data set: root:vision 0750, files 0640
    results: Path  # ada's results folder of the team: ada:vision 0770


@pytest.fixture
def team_tree() -> Iterator[TeamTree]:
    if os.geteuid() != 0:
        required_here("the team folder tests", "they make folders of other uids: run as root")
    # Root's own, below the sticky /tmp, as /shared is below / at a site.
    base = Path(tempfile.mkdtemp(prefix="trainyard-shared-", dir="/tmp"))
    base.chmod(0o755)
    try:
        vision = base / "shared" / "datasets" / "vision"
        vision.mkdir(parents=True)
        for parent in (base / "shared", base / "shared" / "datasets"):
            parent.chmod(0o755)
        for name, text in (("0001.txt", "a cat"), ("0002.txt", "a dog")):
            (vision / name).write_text(text)
            os.chown(vision / name, 0, VISION)
            (vision / name).chmod(0o640)
        os.chown(vision, 0, VISION)
        vision.chmod(0o750)
        results = base / "shared" / "results" / "vision"
        results.mkdir(parents=True)
        (base / "shared" / "results").chmod(0o755)
        os.chown(results, ADA.uid, VISION)
        results.chmod(0o770)
        yield TeamTree(base, vision, results)
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize("as_kernel", [True, False], ids=["kernel", "permission-bits"])
def test_the_kernel_and_the_bits_agree_who_may_read_and_write_a_team_folder(
    team_tree: TeamTree, as_kernel: bool
) -> None:
    found = folderaccess.check(str(team_tree.vision), ADA, False, as_kernel=as_kernel)
    assert (found.real, found.writable) == (team_tree.vision, False)
    with pytest.raises(FolderRefused, match=r"uid 20002, gid 20002.* may not read it"):
        folderaccess.check(str(team_tree.vision), GRACE, False, as_kernel=as_kernel)
    # Readable to her group is not writable to her.
    with pytest.raises(FolderRefused, match="may not write it"):
        folderaccess.check(str(team_tree.vision), ADA, True, as_kernel=as_kernel)
    assert folderaccess.check(str(team_tree.results), ADA, True, as_kernel=as_kernel).writable
    # Grace cannot even enter the folder above a folder of hers inside vision.
    inside = team_tree.vision / "grace"
    inside.mkdir()
    os.chown(inside, GRACE.uid, GRACE.gid)
    with pytest.raises(FolderRefused, match="may not"):
        folderaccess.check(str(inside), GRACE, False, as_kernel=as_kernel)


def test_a_folder_that_someone_else_could_swap_before_the_bind_is_refused(
    team_tree: TeamTree,
) -> None:
    # A results folder in the team's group-writable folder: any member could move it aside
    # and leave a link to anywhere in its place.
    shared_by_group = team_tree.base / "shared" / "scratch"
    shared_by_group.mkdir()
    os.chown(shared_by_group, 0, VISION)
    shared_by_group.chmod(0o2770)
    mine = shared_by_group / "ada"
    mine.mkdir()
    os.chown(mine, ADA.uid, ADA.gid)
    with pytest.raises(FolderRefused, match=r"can be written by group 30001 \(mode 2770\)"):
        folderaccess.check(str(mine), ADA, True)
    # Below a folder of a person's own, whoever owns what is inside.
    owned = team_tree.results / "runs"
    owned.mkdir()
    with pytest.raises(FolderRefused, match="can be written by its owner, uid 20001"):
        folderaccess.check(str(owned), ADA, False)
    # Sticky and world-writable (like /tmp): safe only for an entry of root's.
    sticky = team_tree.base / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "roots").mkdir(mode=0o755)
    assert folderaccess.check(str(sticky / "roots"), ADA, False).real == sticky / "roots"
    (sticky / "adas").mkdir(mode=0o755)
    os.chown(sticky / "adas", ADA.uid, ADA.gid)
    with pytest.raises(FolderRefused, match="can be written by everyone"):
        folderaccess.check(str(sticky / "adas"), ADA, False)


def test_links_are_followed_and_what_is_no_folder_of_a_jobs_is_refused(
    team_tree: TeamTree, tmp_path: Path
) -> None:
    link = team_tree.base / "vision-link"
    link.symlink_to(team_tree.vision)
    found = folderaccess.check(str(link), ADA, False)
    # Bound from where it resolved to, to where the job named it.
    assert (found.path, found.real) == (str(link), team_tree.vision)
    agent = team_tree.base / "shared" / "datasets"
    with pytest.raises(FolderRefused, match="is or holds a folder of Trainyard's own"):
        folderaccess.check(str(team_tree.vision), ADA, False, guarded=[agent / "vision"])
    with pytest.raises(FolderRefused, match="is or holds a folder of Trainyard's own"):
        folderaccess.check(str(agent), ADA, False, guarded=[agent / "vision" / "agent-work"])
    for path, said in (
        ("/", "the whole file system"),
        ("shared/datasets", "not an absolute path"),
        (f"{team_tree.vision}/../vision", "not in its plain form"),
        (f"{team_tree.vision}/", "not in its plain form"),
        (str(team_tree.base / "missing"), "may not read it, or it is no folder here"),
        (str(team_tree.vision / "0001.txt"), "may not read it, or it is no folder here"),
    ):
        with pytest.raises(FolderRefused, match=said):
            folderaccess.check(path, ADA, False)


def as_person(user: unixids.JobUser) -> dict[str, Any]:
    return {"run_uid": user.uid, "run_gid": user.gid, "run_groups": list(user.groups)}


def test_a_team_members_job_reads_the_data_and_writes_results_that_are_theirs(
    node: Supervisor, reports: Reports, client: redis.Redis, team_tree: TeamTree, tmp_path: Path
) -> None:
    if not node.sandbox.switches_uid:
        required_here("the identity tests", "the agent cannot give uids here (not root)")
    args = ["--data", str(team_tree.vision), "--results", str(team_tree.results),
            "--try", str(tmp_path / "spool"), "--try", str(team_tree.base / "shared")]  # fmt: skip
    node.start(
        spec(
            "team_data.py",
            job_id=41,
            owner=5,
            checkpoint_key="k41",
            args=args,
            data_folders=[str(team_tree.vision)],
            results_folder=str(team_tree.results),
            **as_person(ADA),
        )
    )
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=41)
    lines = texts(client, 41)
    assert exited["state"] == "succeeded", (exited["reason"], lines)
    assert f"identity uid=20001 gid=20001 groups={[20001, 30000, VISION]}" in lines
    assert f"data {team_tree.vision}: 0001.txt, 0002.txt" in lines
    assert "first sample says: a cat" in lines
    assert "data writable: no (Read-only file system)" in lines
    # The agent's spool is not in there; of the team's tree, only what the job named is.
    assert f"try {tmp_path / 'spool'}: BLOCKED (No such file or directory)" in lines
    assert f"try {team_tree.base / 'shared'}: OK" in lines
    assert sorted(os.listdir(team_tree.base / "shared")) == ["datasets", "results"]
    result = team_tree.results / "result-0.txt"
    assert result.read_text() == "2 samples, first: a cat\n"
    assert (result.stat().st_uid, result.stat().st_gid) == (ADA.uid, ADA.gid)
    (saved,) = [line.removeprefix("saved ") for line in lines if line.startswith("saved ")]
    checkpoint = Path(saved)
    assert checkpoint.is_relative_to(node.checkpoint_root)
    assert (checkpoint.stat().st_uid, checkpoint.stat().st_gid) == (ADA.uid, ADA.gid)
    assert (checkpoint.parent.stat().st_uid, checkpoint.parent.stat().st_gid) == ADA.ids


def test_a_job_of_someone_outside_the_group_fails_before_it_starts_saying_why(
    node: Supervisor, reports: Reports, client: redis.Redis, team_tree: TeamTree
) -> None:
    if not node.sandbox.switches_uid:
        required_here("the identity tests", "the agent cannot give uids here (not root)")
    node.start(
        spec(
            "team_data.py",
            job_id=42,
            owner=6,
            args=["--data", str(team_tree.vision)],
            data_folders=[str(team_tree.vision)],
            **as_person(GRACE),
        )
    )
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=42)
    assert exited["state"] == "failed"
    assert exited["reason"] == (
        f"data folder refused on n1: {team_tree.vision}: uid 20002, gid 20002, groups 30000 "
        "(the owner's own) may not read it, or it is no folder here"
    )
    assert not any(line.startswith("identity") for line in texts(client, 42))


def test_a_job_sent_to_run_as_root_never_starts(
    node: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    node.start(spec("team_data.py", job_id=43, owner=6, run_uid=0, run_gid=0))
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=43)
    assert exited["state"] == "failed"
    assert (
        "n1 refuses to run it: the Unix identity of the owner of job 43 has uid 0"
        in (exited["reason"])
    )
    assert not any(line.startswith("identity") for line in texts(client, 43))


def test_a_refusal_tells_nobody_what_lies_in_folders_closed_to_them(team_tree: TeamTree) -> None:
    """A folder that is not there, in a folder closed to the person, is refused in the same
    words as one that is there: neither the words nor being let through say which."""
    there, not_there = team_tree.vision, team_tree.vision / "not-there"
    for path in (there, not_there):
        with pytest.raises(FolderRefused) as refused:
            folderaccess.check(str(path), GRACE, False, as_kernel=False)
        assert str(refused.value) == (
            f"{path}: uid 20002, gid 20002, groups 30000 (the owner's own) may not read it, or "
            "it is no folder here"
        )
    # The console lets a folder it cannot see through to the nodes only where the person could
    # have looked for it.
    assert not folderaccess.may_look_where(str(not_there / "deeper"), GRACE)
    assert folderaccess.may_look_where(str(not_there / "deeper"), ADA)
    assert folderaccess.may_look_where("/nowhere/at/all", GRACE)
