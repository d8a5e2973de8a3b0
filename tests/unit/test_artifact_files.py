"""workers/artifacts.py and jobfiles.list_tree: the agent lists and reads only the job's own
regular files in its checkpoint and working folders.

Each hostile case puts in a file's place what a trainer can make in its own folders (a link to
a root-only file, a FIFO, a hard link, a file of another uid, a folder swapped for a link) and
checks that nothing but the job's own bytes is listed or read, and that nothing blocks."""

import os
from pathlib import Path

import pytest

from workers import artifacts, jobfiles, workfolder

JOB_UID = 1_900_000_007
OTHER_UID = 1_900_000_008
KEY = "0123abcd"


@pytest.fixture
def job(tmp_path: Path) -> artifacts.JobFolders:
    """Job 7's checkpoint and working folders under a checkpoint root, the job's own, with
    its code as the agent installs it (root's `.code/` and the links into it)."""
    folders = artifacts.JobFolders(tmp_path, 7, KEY, JOB_UID)
    checkpoints = folders.folder(artifacts.CHECKPOINTS)
    work = folders.folder(artifacts.OUTPUTS)
    for folder in (checkpoints, work):
        folder.mkdir(parents=True)
        os.chown(folder, JOB_UID, JOB_UID)
    (checkpoints / ".trainyard-job").write_text("7\n")  # the agent's marker, root's
    code = work / workfolder.CODE_DIR
    code.mkdir()
    (code / "train.py").write_text("print('training')\n")
    workfolder.link_entries(work, code, relative=True)
    return folders


def owned(path: Path, data: bytes, uid: int = JOB_UID) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chown(path, uid, uid)
    return path


def secret(tmp_path: Path) -> Path:
    path = tmp_path / "shadow"
    path.write_text("root:SECRET-HASH:19000::::::\n")
    path.chmod(0o600)
    return path


def test_it_lists_checkpoints_and_outputs_but_not_the_code_or_the_platforms_files(
    job: artifacts.JobFolders,
) -> None:
    owned(job.folder("checkpoints") / "latest.pt", b"weights")
    owned(job.folder("checkpoints") / "epoch-1" / "model.pt", b"older weights")
    owned(job.folder("outputs") / "predictions.csv", b"a,b\n1,2\n")
    found = artifacts.listing(job)
    assert [(f["path"], f["kind"], f["size"]) for f in found["files"]] == [
        ("checkpoints/epoch-1/model.pt", "checkpoint", 13),
        ("checkpoints/latest.pt", "checkpoint", 7),
        ("outputs/predictions.csv", "output", 8),
    ]
    assert found["refused"] == []
    assert found["missing"] == []
    assert not found["truncated"]
    assert all(isinstance(f["mtime"], float) for f in found["files"])


def test_a_job_that_wrote_nothing_yet_lists_its_missing_folders(tmp_path: Path) -> None:
    found = artifacts.listing(artifacts.JobFolders(tmp_path, 8, KEY, JOB_UID))
    assert found["files"] == [] and found["missing"] == ["checkpoints", "outputs"]


def test_it_reads_a_file_in_chunks_with_its_size_and_version(job: artifacts.JobFolders) -> None:
    data = os.urandom(3000)
    owned(job.folder("checkpoints") / "latest.pt", data)
    size, version, first = artifacts.read_chunk(job, "checkpoints/latest.pt", 0, 1000)
    _, same, rest = artifacts.read_chunk(job, "checkpoints/latest.pt", 1000, 5000)
    assert (size, first + rest, same) == (3000, data, version)
    owned(job.folder("checkpoints") / "latest.pt", data[:10])  # the trainer saved anew
    assert artifacts.read_chunk(job, "checkpoints/latest.pt", 0)[1] != version


def test_a_chunk_is_never_more_than_the_bound(job: artifacts.JobFolders) -> None:
    path = owned(job.folder("outputs") / "big.bin", b"")
    with open(path, "wb") as out:
        out.truncate(artifacts.CHUNK_BYTES * 2)  # sparse: takes no room
    size, _, data = artifacts.read_chunk(job, "outputs/big.bin", 0, 1 << 40)
    assert size == artifacts.CHUNK_BYTES * 2 and len(data) == artifacts.CHUNK_BYTES


@pytest.mark.parametrize(
    "path, words",
    [
        ("../job-8-0123abcd/latest.pt", "must start with"),
        ("checkpoints/../../shadow", "'..'"),
        ("checkpoints/a//b", "empty name"),
        ("checkpoints/./latest.pt", "'.'"),
        ("/etc/shadow", "must be relative"),
        ("checkpoints/late\x00st.pt", "NUL"),
        ("checkpoints", "not a file in it"),
        ("outputs/.code/train.py", "the platform's"),
        ("checkpoints/.trainyard-job", "the platform's"),
        ("logs/x", "must start with"),
        ("", "no path"),
    ],
)
def test_a_path_outside_the_jobs_artifacts_is_refused_with_the_reason(
    job: artifacts.JobFolders, path: str, words: str
) -> None:
    with pytest.raises(artifacts.BadPath, match=words):
        artifacts.read_chunk(job, path, 0)


def test_a_missing_file_is_not_found(job: artifacts.JobFolders) -> None:
    with pytest.raises(FileNotFoundError):
        artifacts.read_chunk(job, "checkpoints/nothing.pt", 0)
    with pytest.raises(FileNotFoundError):
        artifacts.read_chunk(job, "outputs/no-folder/x.pt", 0)


def test_a_link_to_a_root_only_file_is_listed_as_refused_and_never_read(
    job: artifacts.JobFolders, tmp_path: Path
) -> None:
    (job.folder("checkpoints") / "model.pt").symlink_to(secret(tmp_path))
    found = artifacts.listing(job)
    assert found["files"] == []
    assert found["refused"] == [
        {"path": "checkpoints/model.pt", "reason": "model.pt is a symbolic link"}
    ]
    with pytest.raises(jobfiles.UnsafeFile, match="symbolic link"):
        artifacts.read_chunk(job, "checkpoints/model.pt", 0)


def test_a_folder_swapped_for_a_link_is_not_gone_into(
    job: artifacts.JobFolders, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    owned(elsewhere / "model.pt", b"not the job's folder")
    (job.folder("checkpoints") / "epoch-1").symlink_to(elsewhere)
    assert artifacts.listing(job)["files"] == []
    with pytest.raises(jobfiles.UnsafeFile, match="not a folder") as refused:
        artifacts.read_chunk(job, "checkpoints/epoch-1/model.pt", 0)
    # Said in the console's names: where the node keeps the job's folders is not told.
    said = artifacts.in_console_words(str(refused.value), job)
    assert said == "epoch-1 in checkpoints/epoch-1 is not a folder (a link?)", said
    assert str(job.checkpoint_root) not in said


def test_a_whole_folder_swapped_for_a_link_is_refused(
    job: artifacts.JobFolders, tmp_path: Path
) -> None:
    work = job.folder("outputs")
    jobfiles.remove_tree(work)
    work.symlink_to(tmp_path)
    found = artifacts.listing(job)
    assert found["files"] == []
    assert [r["path"] for r in found["refused"]] == ["outputs"]


def test_a_fifo_is_refused_without_blocking(job: artifacts.JobFolders) -> None:
    os.mkfifo(job.folder("outputs") / "result.txt")
    assert artifacts.listing(job)["refused"] == [
        {"path": "outputs/result.txt", "reason": "result.txt is not a regular file (a FIFO)"}
    ]
    with pytest.raises(jobfiles.UnsafeFile, match="not a regular file"):
        artifacts.read_chunk(job, "outputs/result.txt", 0)


def test_a_hard_link_is_refused(job: artifacts.JobFolders) -> None:
    own = owned(job.folder("checkpoints") / "own.pt", b"mine")
    os.link(own, job.folder("checkpoints") / "model.pt")
    refused = artifacts.listing(job)["refused"]
    assert {r["path"] for r in refused} == {"checkpoints/model.pt", "checkpoints/own.pt"}
    with pytest.raises(jobfiles.UnsafeFile, match="2 links"):
        artifacts.read_chunk(job, "checkpoints/model.pt", 0)


def test_a_file_of_another_owner_is_refused(job: artifacts.JobFolders) -> None:
    owned(job.folder("outputs") / "theirs.txt", b"another user's", uid=OTHER_UID)
    assert artifacts.listing(job)["refused"] == [
        {
            "path": "outputs/theirs.txt",
            "reason": f"theirs.txt belongs to uid {OTHER_UID}, not the job's",
        }
    ]
    with pytest.raises(jobfiles.UnsafeFile, match="belongs to uid"):
        artifacts.read_chunk(job, "outputs/theirs.txt", 0)


def test_the_code_links_are_left_out_but_other_links_are_said(
    job: artifacts.JobFolders, tmp_path: Path
) -> None:
    work = job.folder("outputs")
    assert (work / "train.py").is_symlink()  # the code's own, linked in
    (work / "notes").symlink_to(secret(tmp_path))
    found = artifacts.listing(job)
    assert [r["path"] for r in found["refused"]] == ["outputs/notes"]


def test_a_listing_stops_at_its_bounds(
    job: artifacts.JobFolders, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "MAX_ENTRIES", 5)
    monkeypatch.setattr(artifacts, "MAX_DEPTH", 2)
    for i in range(10):
        owned(job.folder("checkpoints") / f"epoch-{i}.pt", b"w")
    deep = job.folder("outputs") / "a" / "b" / "c"
    owned(deep / "x.txt", b"deep")
    found = artifacts.listing(job)
    assert found["truncated"]
    assert len(found["files"]) == 5


def test_folders_nested_beyond_the_depth_are_refused_not_walked(
    job: artifacts.JobFolders, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "MAX_DEPTH", 2)
    owned(job.folder("outputs") / "a" / "b" / "c" / "x.txt", b"deep")
    owned(job.folder("outputs") / "a" / "y.txt", b"shallow")
    found = artifacts.listing(job)
    assert [f["path"] for f in found["files"]] == ["outputs/a/y.txt"]
    assert found["refused"] == [
        {"path": "outputs/a/b/c", "reason": "deeper than 2 folders: not listed"}
    ]


def test_a_name_that_is_not_utf8_is_said_not_served(job: artifacts.JobFolders) -> None:
    folder = bytes(job.folder("outputs"))
    fd = os.open(folder + b"/caf\xe9.txt", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)
    os.chown(folder + b"/caf\xe9.txt", JOB_UID, JOB_UID)
    owned(job.folder("outputs") / 'a "quoted"\nname.txt', b"text")
    found = artifacts.listing(job)
    assert [f["path"] for f in found["files"]] == ['outputs/a "quoted"\nname.txt']
    assert found["refused"] == [
        {"path": "outputs/caf\ufffd.txt", "reason": "its name is not UTF-8"}
    ]
