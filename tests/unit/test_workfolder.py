"""A job's working folder (workers/workfolder.py): the code unpacked once per job beside what
the job writes, its entries linked where the script starts, and the folder removed on demand.
The folder rules first, then a real supervisor starting trainers in it."""

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import FIXTURE_CODE_ROOT
from tests.unit.test_supervisor import Reports, spec, texts
from workers import contract, workfolder
from workers.logship import LogShipper
from workers.supervisor import Supervisor


def code_into(files: dict[str, str]) -> Callable[[Path], None]:
    """An unpack function that writes `files` (relative path: text) into the folder given."""

    def unpack(destination: Path) -> None:
        destination.mkdir()
        for name, text in files.items():
            path = destination / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    return unpack


def test_it_names_the_folder_as_the_checkpoint_folder_under_workdirs(tmp_path: Path) -> None:
    assert workfolder.folder_of(tmp_path, 7, "ab12") == tmp_path / "workdirs" / "job-7-ab12"
    assert workfolder.folder_of(tmp_path, 7, "") == tmp_path / "workdirs" / "job-7"


def test_the_code_is_unpacked_once_and_its_entries_linked_beside_the_jobs_own_files(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.json").write_text("the job's own")  # written by an earlier attempt
    files = {"train.py": "print()", "config.json": "the code's", "data/rows.csv": "1,2"}
    code = workfolder.install_code(work, code_into(files))
    assert code == work / ".code" and (code / "data" / "rows.csv").read_text() == "1,2"

    assert workfolder.link_entries(work, code, relative=True) == ["data", "train.py"]
    assert os.readlink(work / "train.py") == ".code/train.py"
    assert (work / "data" / "rows.csv").read_text() == "1,2"  # through the link
    assert (work / "config.json").read_text() == "the job's own"  # never replaced
    # Another start (another node, a restart) finds the code there and links nothing twice.
    again = workfolder.install_code(work, code_into({"other.py": ""}))
    assert again == code and not (code / "other.py").exists()
    assert workfolder.link_entries(work, code, relative=True) == []
    assert not [p for p in work.iterdir() if p.name.startswith(workfolder.STAGING_PREFIX)]


def test_a_node_that_loses_the_race_to_unpack_keeps_the_winners_copy(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()

    def unpack_while_another_node_wins(destination: Path) -> None:
        code_into({"train.py": "winner"})(work / ".code")
        code_into({"train.py": "loser"})(destination)

    code = workfolder.install_code(work, unpack_while_another_node_wins)
    assert (code / "train.py").read_text() == "winner"
    assert sorted(p.name for p in work.iterdir()) == [".code"]  # no staging folder left


def test_a_failed_unpack_leaves_nothing_behind(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()

    def broken(destination: Path) -> None:
        destination.mkdir()
        (destination / "half.py").write_text("")
        raise OSError("no space left")

    with pytest.raises(OSError, match="no space left"):
        workfolder.install_code(work, broken)
    assert list(work.iterdir()) == []


def test_the_code_roots_entries_are_linked_by_absolute_path(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "examples").mkdir(parents=True)
    (root / ".trainyard-marker").write_text("")  # the platform's: never linked
    work = tmp_path / "work"
    work.mkdir()
    assert workfolder.link_entries(work, root, relative=False) == ["examples"]
    assert os.readlink(work / "examples") == str(root / "examples")


def test_remove_takes_the_folder_and_refuses_a_link(tmp_path: Path) -> None:
    folder = tmp_path / "workdirs" / "job-1-ab"
    (folder / ".code").mkdir(parents=True)
    (folder / "snapshot.pt").write_bytes(b"w")
    link = tmp_path / "workdirs" / "job-2-ab"
    link.symlink_to(tmp_path / "elsewhere")
    assert workfolder.remove(folder) and not folder.exists()
    assert not workfolder.remove(folder)  # twice: nothing left, no error
    assert not workfolder.remove(link) and link.is_symlink()


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server, decode_responses=True)
    c.flushdb()
    yield c


def test_every_attempt_starts_in_the_jobs_working_folder_on_the_shared_root(
    client: redis.Redis, tmp_path: Path
) -> None:
    """Two agents (two work dirs, one checkpoint root): what the first attempt saved where it
    stood, the next attempt on the other node finds where it stands."""
    code_root = tmp_path / "code"
    code_root.mkdir()
    shutil.copy(FIXTURE_CODE_ROOT / "env_probe.py", code_root / "env_probe.py")
    (code_root / "counter.py").write_text(
        "import os, pathlib\n"
        "saved = pathlib.Path('saved.txt')\n"  # relative: where it starts
        "count = int(saved.read_text()) + 1 if saved.exists() else 0\n"
        "saved.write_text(str(count))\n"
        "print(f'cwd={os.getcwd()} count={count}', flush=True)\n"
    )
    shared = tmp_path / "shared"
    reports = Reports()
    shipper = LogShipper(client, tmp_path / "spool")
    nodes = [
        Supervisor(
            name, client, shipper, reports, tmp_path / name, code_root, checkpoint_root=shared
        )
        for name in ("n1", "n2")
    ]
    try:
        for attempt, node in enumerate(nodes):
            job = spec("counter.py", job_id=50, attempt=attempt, checkpoint_key="ef56")
            assert node.start(job)
            exited = reports.wait_for(
                contract.TASK_REPLICA_EXITED, timeout=300, job_id=50, attempt=attempt
            )
            assert exited["state"] == "succeeded", exited
        work = shared / "workdirs" / "job-50-ef56"
        assert texts(client, 50) == [f"cwd={work} count=0", f"cwd={work} count=1"]
        assert os.readlink(work / "counter.py") == str(code_root / "counter.py")
        for node in nodes:
            assert node.remove_working_folder(50, "ef56") or not work.exists()
        assert not work.exists()
        assert not nodes[0].remove_working_folder(50, "../../etc")  # a key names nothing else
    finally:
        for node in nodes:
            node.shutdown()
        shipper.close()


def test_a_link_in_place_of_the_code_is_refused(tmp_path: Path) -> None:
    """A job (on a node without the sandbox) that put a link where its code was would have the
    agent show what it names in its next attempt's sandbox: refused, and nothing is made."""
    work = tmp_path / "work"
    work.mkdir()
    (work / ".code").symlink_to(tmp_path)
    with pytest.raises(workfolder.WorkFolderError, match="is a link"):
        workfolder.install_code(work, code_into({"train.py": ""}))
    assert sorted(p.name for p in work.iterdir()) == [".code"]


def test_the_code_is_staged_where_the_jobs_trainers_cannot_write(tmp_path: Path) -> None:
    """Trainers of the job on another node may already write in its working folder: the code
    is filled (as root) in a folder beside it, in the agents' own folder, and renamed in."""
    work = tmp_path / "workdirs" / "job-7-abc"
    work.mkdir(parents=True)
    staged_in: list[Path] = []

    def unpack(staging: Path) -> None:
        staged_in.append(staging.parent)
        code_into({"train.py": "print()"})(staging)

    code = workfolder.install_code(work, unpack)
    assert staged_in == [work.parent]
    assert code == work / ".code" and (code / "train.py").is_file()
    assert not [p for p in work.parent.iterdir() if p.name.startswith(workfolder.STAGING_PREFIX)]
