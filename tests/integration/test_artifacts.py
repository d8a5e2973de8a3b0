"""A job's artifacts on the real stack: the built-in digits example saves `latest.pt` and
`model.pt` in TRAINYARD_CHECKPOINT_DIR; the console lists them and streams them through a real
node agent (Celery task, reply list in Redis), by the API and by `trainyard artifacts`, byte for
byte what is on the shared checkpoint root. Another user gets 404. A job that plants a link to
a root-only file as its checkpoint gets nothing of that file, whichever way it asks."""

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningStack, StackClient, pytorch_request
from tests.integration.test_cli import logged_in, run_cli

pytestmark = pytest.mark.integration

QUOTA = {"cpu": 4, "gpus": 0, "memory_gb": 16, "running_jobs": 4}


@dataclass
class Saved:
    owner: StackClient
    config_dir: Path  # the owner's `trainyard login`
    job_id: int
    folder: Path  # its checkpoint folder on the shared root


def checkpoint_folder(stack: RunningStack, job_id: int) -> Path:
    """The job's checkpoint folder on the root every agent of the stack shares."""
    [folder] = (stack.stack.var_dir / "agents" / "checkpoints").glob(f"job-{job_id}-*")
    return folder


@pytest.fixture(scope="module")
def saved(stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Saved]:
    """A digits run of one epoch, ended, and its owner logged in with the CLI."""
    config_dir = tmp_path_factory.mktemp("artifacts-cli")
    owner = logged_in(stack, f"artifacts-{uuid.uuid4().hex[:8]}", config_dir)
    request = pytorch_request("digits with a checkpoint", "digits-ddp", 1, args=["--epochs", "1"])
    job_id = owner.submit(request)["id"]
    assert owner.wait_finished(job_id)["state"] == "succeeded"
    yield Saved(owner, config_dir, job_id, checkpoint_folder(stack, job_id))


def listed(client: StackClient, job_id: int) -> dict[str, Any]:
    response = client.http.get(f"/api/v1/jobs/{job_id}/artifacts")
    assert response.status_code == 200, response.text
    return response.json()


def test_the_api_lists_the_checkpoints_the_job_saved(saved: Saved) -> None:
    listing = listed(saved.owner, saved.job_id)
    files = {f["path"]: f for f in listing["files"]}
    for name in ("latest.pt", "model.pt"):
        on_disk = saved.folder / name
        assert files[f"checkpoints/{name}"]["size"] == on_disk.stat().st_size
        assert files[f"checkpoints/{name}"]["kind"] == "checkpoint"
    # The working folder's code and the platform's marker are no artifacts.
    assert not any(".trainyard" in path or "/.code" in path for path in files)
    assert listing["node"] in ("node-1", "node-2")


def test_the_api_streams_the_checkpoint_byte_for_byte(saved: Saved) -> None:
    on_disk = (saved.folder / "latest.pt").read_bytes()
    with saved.owner.http.stream(
        "GET", f"/api/v1/jobs/{saved.job_id}/artifacts/checkpoints/latest.pt"
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-length"] == str(len(on_disk))
        assert response.headers["content-disposition"] == 'attachment; filename="latest.pt"'
        body = b"".join(response.iter_bytes())
    assert body == on_disk


def test_the_cli_lists_and_downloads_the_checkpoint(saved: Saved, tmp_path: Path) -> None:
    listing = run_cli("artifacts", str(saved.job_id), config_dir=saved.config_dir)
    assert listing.returncode == 0, listing.stderr
    assert "checkpoints/latest.pt" in listing.stdout and "checkpoints/model.pt" in listing.stdout

    target = tmp_path / "weights.pt"
    fetched = run_cli(
        "artifacts", str(saved.job_id), "checkpoints/model.pt", "-o", str(target),
        config_dir=saved.config_dir,
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    assert target.read_bytes() == (saved.folder / "model.pt").read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["weights.pt"]  # no partial file left

    # Without -o: the file's own name, here; never over a file that is there.
    again = run_cli(
        "artifacts", str(saved.job_id), "checkpoints/model.pt",
        config_dir=saved.config_dir, cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "model.pt").read_bytes() == target.read_bytes()
    refused = run_cli(
        "artifacts", str(saved.job_id), "checkpoints/model.pt",
        config_dir=saved.config_dir, cwd=tmp_path,
    )  # fmt: skip
    assert refused.returncode == 2 and "exists already" in refused.stderr


def test_the_cli_says_what_is_wrong_with_a_path(saved: Saved, tmp_path: Path) -> None:
    result = run_cli(
        "artifacts", str(saved.job_id), "checkpoints/../../../etc/shadow",
        config_dir=saved.config_dir, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert "no '..'" in result.stderr
    missing = run_cli(
        "artifacts", str(saved.job_id), "checkpoints/nothing.pt",
        config_dir=saved.config_dir, cwd=tmp_path,
    )  # fmt: skip
    assert missing.returncode == 4 and "No such file: checkpoints/nothing.pt" in missing.stderr
    assert list(tmp_path.iterdir()) == []


def test_another_user_gets_404_from_the_api_and_the_cli(
    stack: RunningStack, saved: Saved, tmp_path: Path
) -> None:
    config_dir = tmp_path / "cli"
    config_dir.mkdir()
    other = logged_in(stack, f"other-{uuid.uuid4().hex[:8]}", config_dir)
    for path in ("artifacts", "artifacts/checkpoints/latest.pt"):
        response = other.http.get(f"/api/v1/jobs/{saved.job_id}/{path}")
        assert response.status_code == 404
        assert response.json() == {"errors": {"job": ["No such job."]}}
    result = run_cli(
        "artifacts", str(saved.job_id), "checkpoints/latest.pt",
        config_dir=config_dir, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 4
    assert [p.name for p in tmp_path.iterdir()] == ["cli"]


def test_a_planted_link_to_a_root_only_file_serves_nothing_of_it(
    stack: RunningStack, saved: Saved, tmp_path_factory: pytest.TempPathFactory
) -> None:
    secrets = tmp_path_factory.mktemp("root-only")
    secrets.chmod(0o700)
    canary = f"CANARY-{uuid.uuid4().hex}"
    shadow = secrets / "shadow"
    shadow.write_text(f"root:{canary}:19000::::::\n")
    shadow.chmod(0o600)
    request = pytorch_request(
        "plants model.pt", "plant.py", 1,
        args=["--kind", "symlink", "--target", str(shadow), "--file", "checkpoint:model.pt"],
    )  # fmt: skip
    job_id = saved.owner.submit(request)["id"]
    assert saved.owner.wait_finished(job_id)["state"] == "succeeded"
    assert (checkpoint_folder(stack, job_id) / "model.pt").is_symlink()

    listing = listed(saved.owner, job_id)
    assert "checkpoints/model.pt" not in [f["path"] for f in listing["files"]]
    assert {"path": "checkpoints/model.pt", "reason": "model.pt is a symbolic link"} in listing[
        "refused"
    ]
    response = saved.owner.http.get(f"/api/v1/jobs/{job_id}/artifacts/checkpoints/model.pt")
    assert response.status_code == 409
    assert response.json() == {"errors": {"path": ["Not served: model.pt is a symbolic link."]}}
    assert canary not in response.text and canary not in str(listing)
    # The file the link names is untouched.
    assert shadow.read_text() == f"root:{canary}:19000::::::\n"
