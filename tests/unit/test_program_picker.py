"""The New-job form's program picker: examples with their arguments, scripts under the code
root, the user's uploaded code, and a typed path; the server still checks whatever is sent."""

import io
import tarfile
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import CodeUpload, Job
from jobs.services import snapshots

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

FORM = {
    "name": "picked",
    "image": "pytorch:2.13-cpu",
    "script": "digits-ddp",
    "script_path": "",
    "snapshot_script": "",
    "args": "",
    "package": "cpu-1",
    "instances": "2",
}


def uploaded(owner: User, tmp_path: Path, name: str = "mlp") -> CodeUpload:
    root = tmp_path / name
    (root / "lib").mkdir(parents=True)
    (root / "train.py").write_text("print('training')\n")
    (root / "lib" / "util.py").write_text("X = 1\n")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        tar.add(root, arcname=".")
    data.seek(0)
    return snapshots.store_upload(owner, data, name=name).upload


def test_it_offers_the_examples_with_what_they_do_and_take(client: Client, alice: User) -> None:
    client.force_login(alice)
    html = client.get("/jobs/new/").content.decode()
    assert '<optgroup label="Built-in examples">' in html
    assert '<div class="program-about" data-program="digits-ddp" hidden>' in html
    assert "a small MLP on scikit-learn&#x27;s digits" in html
    assert "<code>--epochs N</code></td><td>passes over the data</td>" in html


def test_it_offers_the_scripts_under_the_code_root(client: Client, alice: User) -> None:
    client.force_login(alice)
    html = client.get("/jobs/new/").content.decode()
    assert '<optgroup label="Scripts under the code root">' in html
    assert '<option value="fail.py">fail.py</option>' in html
    assert '<datalist id="code-root-scripts">' in html and '<option value="markup.py">' in html


def test_it_runs_a_script_picked_from_the_code_root(client: Client, alice: User) -> None:
    client.force_login(alice)
    r = client.post("/jobs/new/", dict(FORM, script="fail.py"))
    assert r.status_code == 302
    assert Job.objects.get().program == {"path": "fail.py"}


def test_a_typed_path_still_runs_and_is_still_checked(client: Client, alice: User) -> None:
    client.force_login(alice)
    r = client.post("/jobs/new/", dict(FORM, script="__path__", script_path="nope.py"))
    assert "No script at &#x27;nope.py&#x27; under the code root." in r.content.decode()
    r = client.post("/jobs/new/", dict(FORM, script="__path__", script_path="markup.py"))
    assert r.status_code == 302
    assert Job.objects.get().program == {"path": "markup.py"}


def test_it_offers_only_the_users_own_uploads(
    client: Client, alice: User, bob: User, tmp_path: Path
) -> None:
    mine = uploaded(alice, tmp_path)
    uploaded(bob, tmp_path, name="bobs")
    client.force_login(alice)
    html = client.get("/jobs/new/").content.decode()
    sha = mine.snapshot.sha256
    assert '<optgroup label="Your uploaded code">' in html
    assert f'<option value="snapshot:{sha}">mlp · {sha[:12]} · 2 files' in html
    assert f'"{sha}": {{"scripts": ["lib/util.py", "train.py"], "entry_point": "train.py"}}' in html
    assert "bobs" not in html


def test_it_runs_a_script_inside_an_upload(client: Client, alice: User, tmp_path: Path) -> None:
    sha = uploaded(alice, tmp_path).snapshot.sha256
    client.force_login(alice)
    r = client.post("/jobs/new/", dict(FORM, script=f"snapshot:{sha}", snapshot_script="train.py"))
    assert r.status_code == 302
    job = Job.objects.get()
    assert job.program == {"path": "train.py", "snapshot": sha}
    assert job.snapshot is not None and job.snapshot.sha256 == sha


def test_a_file_not_in_the_upload_is_refused_beside_its_box(
    client: Client, alice: User, tmp_path: Path
) -> None:
    sha = uploaded(alice, tmp_path).snapshot.sha256
    client.force_login(alice)
    html = client.post(
        "/jobs/new/", dict(FORM, script=f"snapshot:{sha}", snapshot_script="nope.py")
    ).content.decode()
    box = html.index('id="field-snapshot_script"')
    assert html.index("No file &#x27;nope.py&#x27; in code snapshot", box) < html.index(
        'id="field-args"', box
    )
    assert Job.objects.count() == 0


def test_someone_elses_upload_cannot_be_picked(
    client: Client, alice: User, bob: User, tmp_path: Path
) -> None:
    sha = uploaded(bob, tmp_path).snapshot.sha256
    client.force_login(alice)
    r = client.post("/jobs/new/", dict(FORM, script=f"snapshot:{sha}", snapshot_script="train.py"))
    assert "Select a valid choice" in r.content.decode()
    assert Job.objects.count() == 0
