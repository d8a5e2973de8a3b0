"""Process records and the reaper: a recorded group dies with its children, and nothing else."""

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from tests.conftest import process_alive
from tests.unit.test_supervisor import Tree
from workers.procrecords import ProcRecord, ProcRecords, reap, reap_all, summary


@pytest.fixture
def trees() -> Iterator[list[Tree]]:
    made: list[Tree] = []
    yield made
    for tree in made:
        tree.kill()


@pytest.fixture
def tree(trees: list[Tree]) -> Tree:
    trees.append(Tree())
    return trees[-1]


def test_it_writes_reads_and_removes_records(tmp_path: Path) -> None:
    records = ProcRecords(tmp_path / "procs")
    assert records.load() == []  # no folder yet
    first = ProcRecord(3, "worker", 1, pid=1234, pgid=1234, create_time=1795000000.25)
    second = ProcRecord(4, "master", 0, pid=1300, pgid=1300, create_time=1795000001.5)
    path = records.write(first)
    records.write(second)
    assert path.name == "3-worker-1-1234.json"
    assert json.loads(path.read_text()) == {
        "job_id": 3, "role": "worker", "index": 1, "pid": 1234, "pgid": 1234,
        "create_time": 1795000000.25, "keeper_pid": 0, "keeper_create_time": 0.0,
    }  # fmt: skip
    (tmp_path / "procs" / "garbage.json").write_text("{not json")
    assert records.load() == [first, second]
    assert records.load(job_id=4) == [second]
    records.remove(first)
    records.remove(first)  # twice: no harm
    assert records.load() == [second]
    assert sorted(p.name for p in (tmp_path / "procs").iterdir()) == [
        "4-master-0-1300.json",
        "garbage.json",
    ]  # no temporary file left behind


def test_a_role_cannot_put_a_record_outside_its_folder(tmp_path: Path) -> None:
    record = ProcRecord(3, "../../x", 1, pid=1, pgid=1, create_time=0.0)
    assert ProcRecords(tmp_path / "procs").write(record).parent == tmp_path / "procs"


def test_it_kills_the_recorded_group_with_the_children_in_it(tree: Tree) -> None:
    killed = reap(tree.record())
    assert sorted(killed or []) == sorted(tree.pids)
    assert tree.alive() == [False, False]


def test_it_kills_what_is_left_of_a_group_whose_leader_is_gone(tree: Tree) -> None:
    record = tree.record()
    tree.proc.kill()
    tree.proc.wait()  # reaped: no process has the group's id as its pid any more
    assert tree.alive() == [False, True]
    assert reap(record) == [tree.child]
    assert not process_alive(tree.child)


def test_it_spares_a_process_that_reused_the_recorded_pid(tree: Tree) -> None:
    # The same pid, started at another time: not the process we recorded, nor its group.
    stranger = replace(tree.record(), create_time=tree.record().create_time - 100)
    assert reap(stranger) == []
    assert tree.alive() == [True, True]


def test_it_kills_nothing_when_the_group_has_ended(tree: Tree) -> None:
    record = tree.record()
    tree.kill()
    assert reap(record) == []


def test_reap_all_kills_the_job_it_is_asked_for_and_removes_its_records(
    trees: list[Tree], tmp_path: Path
) -> None:
    records = ProcRecords(tmp_path / "procs")
    mine, spared, other_job = Tree(), Tree(), Tree()
    trees.extend([mine, spared, other_job])
    records.write(mine.record(job_id=7, role="master", index=0))
    records.write(spared.record(job_id=7, index=2))
    records.write(other_job.record(job_id=8))

    reaped = reap_all(records, job_id=7, spare=frozenset({spared.trainer}))

    assert [r.record.pid for r in reaped] == [mine.trainer]
    assert mine.alive() == [False, False]
    assert spared.alive() == [True, True] and other_job.alive() == [True, True]
    assert sorted(r.pid for r in records.load()) == sorted([spared.trainer, other_job.trainer])
    first, second = sorted(mine.pids)
    assert summary(reaped, "an earlier agent") == (
        f"2 processes left by an earlier agent: job 7 master pid {first}, pid {second}"
    )


def test_reap_all_spares_a_group_whose_keeper_lives_and_reaps_it_once_the_keeper_is_gone(
    trees: list[Tree], tmp_path: Path
) -> None:
    records = ProcRecords(tmp_path / "procs")
    held, orphaned = Tree(), Tree()
    trees.extend([held, orphaned])
    me = psutil.Process()  # stands for a live keeper
    records.write(replace(held.record(job_id=9), keeper_pid=me.pid,
                          keeper_create_time=me.create_time()))  # fmt: skip
    # Its keeper's pid now names another process (or none): the keeper is gone.
    records.write(replace(orphaned.record(job_id=9, index=2), keeper_pid=me.pid,
                          keeper_create_time=me.create_time() - 10))  # fmt: skip

    reaped = reap_all(records)

    assert [r.record.pid for r in reaped] == [orphaned.trainer]
    assert held.alive() == [True, True] and orphaned.alive() == [False, False]
    assert [r.pid for r in records.load()] == [held.trainer]
