"""People, not uids, on the real stack: a person who signs in through the organisation's
directory (a real OpenLDAP slapd, stack/directory.py) brings their Unix identity, and their
job's trainers run as it on the stack's root agents, in real bubblewrap sandboxes:

- ada, in the directory group `vision`, names the team's data set (root:vision, 0750) and her
  results folder: her job reads the one and writes into the other, and the file it wrote, and
  its checkpoint, carry her uid and gid; its API says whom it ran as;
- grace, outside the group, is refused at submission with the reason, and so is a local
  account the console knows no Unix identity of; nothing is written for either.

The sign-in is django-auth-ldap's, through the console's own backend, in the stack's database
(the stack's web server is a shared one, set up without a directory); the login page itself,
sessions and their end when the directory disables someone are tests/unit/test_directory.py's
and tests/browser/test_directory_sign_in.py's.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from stack import directory as slapd
from stack.run import ROOT
from tests.conftest import RunningStack, StackClient, required_here
from tests.unit import test_directory, test_named_folders
from tests.unit.test_directory import GROUPS, PEOPLE, SUFFIX, USERS_GROUP
from tests.unit.test_named_folders import ADA, TeamTree

pytestmark = pytest.mark.integration

# The directory tests' slapd, and the team's folder tree.
directory, team_tree = test_directory.directory, test_named_folders.team_tree
QUOTA = {"cpu": 4, "gpus": 0, "memory_gb": 8, "running_jobs": 2}


def sign_in_through_directory(
    stack: RunningStack, directory: slapd.Directory, username: str, password: str
) -> StackClient:
    """Sign `username` in as the console does with TRAINYARD_LDAP_* set; an API client for
    them, with a quota of their own."""
    code = (
        "from django.contrib.auth import authenticate; from jobs.models import Quota; "
        "from jobs.services import tokens; "
        f"user = authenticate(None, username={username!r}, password={password!r}); "
        "assert user is not None, 'the directory refused the sign-in'; "
        f"Quota.objects.get_or_create(user=user, defaults={QUOTA!r}); "
        "print(tokens.issue(user, 'test').key)"
    )
    env = {
        **stack.stack.env(),
        "TRAINYARD_LDAP_URL": directory.url,
        "TRAINYARD_LDAP_BIND_DN": f"cn=trainyard,{SUFFIX}",
        "TRAINYARD_LDAP_BIND_PASSWORD": "console-pw",
        "TRAINYARD_LDAP_USER_BASE": PEOPLE,
        "TRAINYARD_LDAP_GROUP_BASE": GROUPS,
        "TRAINYARD_LDAP_REQUIRE_GROUP": USERS_GROUP,
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return StackClient(stack.url, done.stdout.strip().splitlines()[-1])


def team_job(tree: TeamTree, name: str) -> dict[str, object]:
    return {
        "name": name,
        "image": "pytorch:2.13-cpu",
        "program": {
            "script": "team_data.py",
            "args": ["--data", str(tree.vision), "--results", str(tree.results)],
        },
        "roles": {"master": {"package": "cpu-1", "instances": 1}},
        "data": [str(tree.vision)],
        "results": str(tree.results),
    }


def test_a_directory_persons_job_reads_the_teams_data_as_them_and_what_it_writes_is_theirs(
    stack: RunningStack,
    directory: slapd.Directory,
    team_tree: TeamTree,
) -> None:
    nodes = stack.admin.http.get("/api/v1/nodes").json()["nodes"]
    if not any(n["isolation"] == "sandbox" for n in nodes):
        required_here("the identity test", "no node of the stack gives uids (agents not root)")
    ada = sign_in_through_directory(stack, directory, "ada", "ada-directory-pw")
    job = ada.submit(team_job(team_tree, "ada reads vision"))
    assert job["run_as"] == {"uid": 20001, "gid": 20001, "groups": [20001, 30000, 30001]}
    assert (job["data"], job["results"]) == ([str(team_tree.vision)], str(team_tree.results))
    done = ada.wait_finished(job["id"])
    lines = [line["text"] for line in ada.logs(job["id"])]
    assert done["state"] == "succeeded", (done["reason"], lines)
    assert "identity uid=20001 gid=20001 groups=[20001, 30000, 30001]" in lines
    assert "first sample says: a cat" in lines
    assert "data writable: no (Read-only file system)" in lines
    result = team_tree.results / "result-0.txt"
    assert result.read_text() == "2 samples, first: a cat\n"
    assert (result.stat().st_uid, result.stat().st_gid) == ADA.ids
    (saved,) = [line.removeprefix("saved ") for line in lines if line.startswith("saved ")]
    assert (Path(saved).stat().st_uid, Path(saved).stat().st_gid) == ADA.ids


def test_someone_the_team_folder_is_closed_to_is_refused_at_submission_with_the_reason(
    stack: RunningStack,
    directory: slapd.Directory,
    team_tree: TeamTree,
) -> None:
    grace = sign_in_through_directory(stack, directory, "grace", "grace-directory-pw")
    refused = grace.http.post("/api/v1/jobs", json=team_job(team_tree, "grace reads vision"))
    assert refused.status_code == 400, refused.text
    errors = refused.json()["errors"]
    assert errors["data"] == [
        f"{team_tree.vision}: uid 20002, gid 20002, groups 30000,30002 (the owner's own) may "
        "not read it, or it is no folder here."
    ], errors
    assert errors["results"] == [
        f"{team_tree.results}: uid 20002, gid 20002, groups 30000,30002 (the owner's own) may "
        "not write it, or it is no folder here."
    ], errors
    local = stack.create_user("no-identity", "no-identity-pw-1", QUOTA)
    refused = local.http.post("/api/v1/jobs", json=team_job(team_tree, "local reads vision"))
    assert refused.status_code == 400, refused.text
    assert "the console knows none of yours" in refused.json()["errors"]["data"][0]
    assert not (team_tree.results / "result-0.txt").exists()
