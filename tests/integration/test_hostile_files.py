"""Nothing a job controls reaches root, on the real stack (issue 41; docs/security.md, "The
privileged side").

Mallory's jobs attack the node through what they control, beside alice's running job on the
same stack:
- their environment: a loader variable is refused at submission, and one an admin's image sets
  is loaded by the trainer alone, never by a process of root's;
- the files the node side reads or removes in their folders (the table in docs/security.md):
  each is swapped for a symbolic link to a root-only file, a link to another job's file, a
  FIFO, a hard link, a folder and a terabyte sparse file, while the job runs; then the job
  fails (its error file is read) and is deleted (its folders are removed). Nothing outside the
  job is read, written or removed, and no agent thread is left behind.
"""

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.conftest import RunningStack, signal_file, wait_until
from workers import sandbox

pytestmark = pytest.mark.integration

QUOTA = {"cpu": 4, "gpus": 0, "memory_gb": 16, "running_jobs": 4}
KINDS = ["symlink-root", "symlink-other", "fifo", "hardlink", "dir", "sparse"]
# The files of the job's folders that the node side opens, reads or removes (docs/security.md).
PLANTED = [
    "TRAINYARD_METRICS_FILE",
    "TORCHELASTIC_ERROR_FILE",
    "checkpoint:.trainyard-job",
    "checkpoint:old-checkpoint.pt",
    "work:linked-entry",
]
EVIL_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
    char exe[512] = {0}, buf[64] = {0};
    if (readlink("/proc/self/exe", exe, sizeof exe - 1) < 0) exe[0] = '?';
    fprintf(stderr, "EVIL uid=%d euid=%d exe=%s\n", (int)getuid(), (int)geteuid(), exe);
    const char *target = getenv("EVIL_TARGET");
    FILE *f = target ? fopen(target, "r") : NULL;
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fprintf(stderr, "EVIL READ %s\n", buf);
        fclose(f);
    }
}
"""


@dataclass
class Tenants:
    running: RunningStack
    mallory_name: str
    mallory: Any
    alice: Any
    alice_job: int
    alice_file: Path  # a file of alice's job, owned by her uid, on the same node
    canary: Path  # root-only, 0600, in a root-only folder
    canary_text: str
    alice_text: str


def texts(client: Any, job_id: int) -> list[str]:
    return [line["text"] for line in client.logs(job_id)]


def metrics_of(client: Any, job_id: int) -> str:
    response = client.http.get(f"/api/v1/jobs/{job_id}/metrics")
    assert response.status_code == 200, response.text
    return response.text


def agent_threads(running: RunningStack) -> int:
    """Threads of every agent of the stack, together."""
    return sum(
        psutil.Process(running.stack.pid(name)).num_threads() for name in ("node-1", "node-2")
    )


@pytest.fixture(scope="module")
def tenants(stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    tag = uuid.uuid4().hex[:8]
    mallory_name = f"mallory-{tag}"
    mallory = stack.create_user(mallory_name, "mallory-pw", quota=QUOTA)
    alice = stack.create_user(f"alice-{tag}", "alice-pw", quota=QUOTA)
    secrets = tmp_path_factory.mktemp("root-only")
    secrets.chmod(0o700)
    canary_text = f"CANARY-{uuid.uuid4().hex}"
    canary = secrets / "canary.json"
    # JSON (as an error file is read) and plain lines (as bad metric lines are echoed), long
    # enough that a read from any offset the metrics tail reached still finds the word.
    canary.write_text(
        json.dumps({"message": {"message": f"RuntimeError: {canary_text}"}})
        + "\n"
        + f"{canary_text} plain line\n" * 50
    )
    canary.chmod(0o600)
    release = signal_file()
    alices = alice.submit(
        {
            "name": "alice's run",
            "image": "pytorch:2.13-cpu",
            "program": {"script": "hold.py", "args": ["--release", str(release), "--rate", "2"]},
            "roles": {"master": {"package": "cpu-1", "instances": 1}},
        }
    )
    try:
        job = alice.wait(alices["id"], lambda j: j["state"] == "running")
        node = job["replicas"][0]["node"]
        instance = stack.stack.var_dir / "agents" / node / "jobs" / str(alices["id"])
        folder = wait_until(
            "alice's instance folder", lambda: next(instance.glob("*/master"), None)
        )
        alice_text = f"ALICE-{uuid.uuid4().hex}"
        alice_file = folder / "alice-data.json"
        alice_file.write_text(json.dumps({"message": alice_text}) + "\n" + f"{alice_text}\n" * 50)
        owner = folder.stat().st_uid
        os.chown(alice_file, owner, owner)
        alice_file.chmod(0o600)
        yield Tenants(
            stack,
            mallory_name,
            mallory,
            alice,
            alices["id"],
            alice_file,
            canary,
            canary_text,
            alice_text,
        )
    finally:
        release.touch()
        alice.wait_finished(alices["id"])


def plant_request(name: str, kind: str, target: Path, hold: Path, folder: Path) -> dict[str, Any]:
    files = [arg for f in PLANTED for arg in ("--file", f)]
    return {
        "name": name,
        "image": "pytorch:2.13-cpu",
        "program": {
            "script": "plant.py",
            "args": [
                "--kind",
                kind.split("-")[0],
                "--target",
                str(target),
                "--folder-target",
                str(folder),
                *files,
                "--hold",
                str(hold),
                "--exit",
                "1",
            ],
        },
        "roles": {"master": {"package": "cpu-1", "instances": 1}},
    }


@pytest.mark.parametrize("kind", KINDS)
def test_what_a_job_plants_in_its_folders_reaches_nothing_outside_it(
    tenants: Tenants, kind: str
) -> None:
    running, mallory = tenants.running, tenants.mallory
    target = tenants.alice_file if kind == "symlink-other" else tenants.canary
    canary_before = tenants.canary.read_bytes()
    alice_before = tenants.alice_file.read_bytes()
    threads_before = agent_threads(running)
    hold = signal_file()
    job = mallory.submit(plant_request(f"plant {kind}", kind, target, hold, tenants.canary.parent))
    try:
        wait_until("the traps", lambda: "planted" in texts(mallory, job["id"]))

        # While it runs: the agent's next read of the metrics file meets the trap and says so
        # (a sparse file is the job's own: its zeros are skipped as an over-long line), or,
        # where it followed the trap, echoes what it read (asserted against below).
        def met_the_trap() -> bool:
            shown = texts(mallory, job["id"])
            return any(
                (t.startswith("[trainyard metrics]") and "metrics-0.jsonl" in t)
                or "256 KiB" in t
                or tenants.canary_text in t
                or tenants.alice_text in t
                for t in shown
            )

        wait_until("the agent to meet the metrics file's trap", met_the_trap)
    finally:
        hold.touch()
    ended = mallory.wait_finished(job["id"])
    # It failed (its error file was read, or refused) and says how it ended.
    assert ended["state"] == "failed"
    assert "exited with code 1" in ended["reason"]
    seen = "\n".join(texts(mallory, job["id"])) + metrics_of(mallory, job["id"])
    seen += ended["reason"] + json.dumps(ended)
    for secret in (tenants.canary_text, tenants.alice_text):
        assert secret not in seen
    # Deleted: its folders go; what its links pointed to stays, untouched.
    running.stack.manage(
        "shell", "-c", f"from jobs.services.deletion import delete_job; delete_job({job['id']})"
    )
    checkpoints = running.stack.var_dir / "agents" / "checkpoints"
    wait_until(
        "the deleted job's folders to be removed",
        lambda: (
            not list(checkpoints.glob(f"job-{job['id']}-*"))
            and not list((checkpoints / "workdirs").glob(f"job-{job['id']}-*"))
        ),
    )
    assert tenants.canary.read_bytes() == canary_before
    assert tenants.alice_file.read_bytes() == alice_before
    # No thread of an agent is left on a trap (a FIFO held one for ever).
    wait_until("the agents' threads to end", lambda: agent_threads(running) <= threads_before)


def test_a_loader_variable_is_refused_at_submission(tenants: Tenants) -> None:
    response = tenants.mallory.http.post(
        "/api/v1/jobs",
        json={
            "name": "preload",
            "image": "pytorch:2.13-cpu",
            "program": {"script": "plant.py", "args": []},
            "roles": {"master": {"package": "cpu-1", "instances": 1}},
            "env": {"LD_PRELOAD": ".code/evil.so"},
        },
    )
    assert response.status_code == 400
    assert "LD_PRELOAD is read by the dynamic loader" in response.json()["errors"]["env"][0]


@pytest.fixture(scope="module")
def evil_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc): the LD_PRELOAD test builds a library to preload")
    folder = tmp_path_factory.mktemp("evil-code")
    (folder / "evil.c").write_text(EVIL_C)
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(folder / "evil.so"), str(folder / "evil.c")],
        check=True,
    )
    (folder / "evil.c").unlink()
    (folder / "train.py").write_text('print("trained", flush=True)\n')
    return folder


def test_a_loader_variable_that_gets_through_runs_as_the_jobs_uid_alone(
    tenants: Tenants, evil_library: Path
) -> None:
    """An admin's image sets LD_PRELOAD to a library in the job's own code, as a mistake, or a
    job stored before the refusal has it: the trainer loads it, as mallory's uid; not one
    process of root's does (the death-signal shim, env, bwrap, setpriv), so it reads nothing
    of root's."""
    running = tenants.running
    secret_key = running.stack.var_dir / "secret_key"
    image = f"preloading-{uuid.uuid4().hex[:6]}"
    defaults = {"LD_PRELOAD": ".code/evil.so", "EVIL_TARGET": str(secret_key)}
    running.stack.manage(
        "shell",
        "-c",
        "from jobs.models import FrameworkImage\n"
        "image = FrameworkImage.objects.get(name='pytorch:2.13-cpu')\n"
        f"image.pk, image.name = None, {image!r}\n"
        f"image.default_env = {defaults!r}\n"
        "image.save()",
    )
    try:
        sha = tenants.mallory.upload(evil_library, "evil")
        job = tenants.mallory.submit(
            {
                "name": "preload",
                "image": image,
                "program": {"snapshot": sha, "script": "train.py", "args": []},
                "roles": {"master": {"package": "cpu-1", "instances": 1}},
            }
        )
        tenants.mallory.wait_finished(job["id"])
    finally:
        # The stack is shared: no later test may find this image on its New-job form.
        running.stack.manage(
            "shell",
            "-c",
            "from jobs.models import FrameworkImage\n"
            f"FrameworkImage.objects.filter(name={image!r}).update(enabled=False)",
        )
    evil = [t for t in texts(tenants.mallory, job["id"]) if t.startswith("EVIL")]
    uid = sandbox.DEFAULT_UID_BASE
    loaded_by = [t for t in evil if t.startswith("EVIL uid=")]
    assert loaded_by, "the trainer did not load the library: the test proves nothing"
    assert all(int(t.split()[1].split("=")[1]) >= uid for t in loaded_by), loaded_by
    assert all(int(t.split()[2].split("=")[1]) >= uid for t in loaded_by), loaded_by
    assert not [t for t in evil if t.startswith("EVIL READ")]


def test_the_forms_json_is_refused_past_the_apis_depth_not_answered_with_a_500(
    tenants: Tenants,
) -> None:
    """2,000 levels of [ in the health-rules box, through the real web server: the form says
    why beside the box and the editor's check answers its error; nothing is created."""
    deep = "[" * 2000 + "]" * 2000
    with httpx.Client(base_url=tenants.running.url, timeout=30) as browser:
        browser.get("/accounts/login/")
        browser.post(
            "/accounts/login/",
            data={
                "username": tenants.mallory_name,
                "password": "mallory-pw",
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            },
        )
        before = tenants.mallory.http.get("/api/v1/jobs").json()["count"]
        token = browser.cookies["csrftoken"]
        form = {
            "csrfmiddlewaretoken": token, "name": "deep", "image": "pytorch:2.13-cpu",
            "script": "digits-ddp", "script_path": "", "args": "", "package": "cpu-1",
            "instances": "1", "health_rules": deep,
        }  # fmt: skip
        page = browser.post("/jobs/new/", data=form)
        assert page.status_code == 200
        assert "The rules are nested too deeply" in page.text
        check = browser.post(
            "/jobs/new/health-rules/",
            data={"csrfmiddlewaretoken": token, "health_rules": deep},
            headers={"X-CSRFToken": token},
        )
        assert check.status_code == 200
        assert "nested too deeply" in check.json()["error"]
        assert tenants.mallory.http.get("/api/v1/jobs").json()["count"] == before
