"""A job's own Slurm options: only what its pool's admin allows reaches sbatch, every refusal
says what is allowed, and a choice replaces the pool's default of the same option."""

import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from jobs.models import FrameworkImage, Job, Package, SlurmPool
from jobs.services import rerun
from jobs.services.slurm import slurm_batch, slurm_choices
from jobs.services.slurm.slurm_choices import SlurmChoices
from jobs.services.slurm.slurm_identity import Identity
from jobs.services.submission import ValidationFailed, check_job_request, create_job
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes")


@pytest.fixture
def pool(tmp_path: Path) -> SlurmPool:
    pool = SlurmPool.objects.create(
        name="site", partition="gpuq,long", shared_root=str(tmp_path), python=sys.executable,
        account="ml", qos="normal", constraint="ib", job_qos="normal high",
        job_constraints="ib&a100 ib|v100", job_accounts="vision speech",
    )  # fmt: skip
    pool.images.set(FrameworkImage.objects.all())
    pool.packages.set(Package.objects.all())
    return pool


def slurm_errors(pool: SlurmPool, slurm: dict[str, object]) -> list[str]:
    with pytest.raises(ValidationFailed) as caught:
        check_job_request({**job_request(instances=2), "pool": pool.name, "slurm": slurm})
    assert Job.objects.count() == 0
    return caught.value.errors["slurm"]


def test_a_choice_outside_what_the_pool_allows_is_refused_saying_what_it_allows(
    pool: SlurmPool,
) -> None:
    assert slurm_errors(pool, {"qos": "urgent"}) == [
        "Pool site does not let a job choose qos 'urgent'; it allows normal, high."
    ]
    assert slurm_errors(pool, {"partition": "debug"}) == [
        "Pool site has no partition 'debug'; it has gpuq, long."
    ]
    assert slurm_errors(pool, {"reservation": "maint"}) == [
        "Pool site does not let a job choose reservation 'maint'; it allows none: the pool's "
        "own only."
    ]
    assert slurm_errors(pool, {"exclusive": True}) == [
        "Pool site does not let a job ask for whole nodes (exclusive)."
    ]
    # Several problems at once, each named.
    assert len(slurm_errors(pool, {"qos": "urgent", "account": "finance"})) == 2


def test_slurm_options_need_a_slurm_pool(pool: SlurmPool) -> None:
    with pytest.raises(ValidationFailed) as caught:
        check_job_request({**job_request(instances=2), "slurm": {"qos": "high"}})
    assert caught.value.errors == {
        "slurm": ["Slurm options are for a job of a Slurm pool: choose its pool."]
    }
    with pytest.raises(ValidationFailed) as caught:
        check_job_request({**job_request(instances=2), "pool": "site", "slurm": {"nice": "1"}})
    assert caught.value.errors == {"slurm": ["Unknown field(s): nice."]}


def test_the_jobs_choices_replace_the_pools_defaults_on_sbatchs_command_line(
    pool: SlurmPool, alice: User
) -> None:
    request = check_job_request(
        {
            **job_request(instances=2),
            "pool": "site",
            "slurm": {"partition": "long", "qos": "high", "constraint": "ib&a100"},
        }
    )
    job = create_job(alice, request, None, None)
    assert job.slurm_options == {"partition": "long", "qos": "high", "constraint": "ib&a100"}
    target = slurm_batch.target_of(pool)
    script = Path(pool.shared_root) / "batch.py"
    argv = slurm_batch.sbatch_argv(job, target, script)
    assert "--partition=long" in argv
    assert [a for a in argv if a.split("=")[0] in ("--account", "--qos", "--constraint")] == [
        "--account=ml",
        "--qos=high",
        "--constraint=ib&a100",
    ]
    # A rerun asks for the same.
    assert rerun.request_of(job, alice)["slurm"] == job.slurm_options


def test_with_no_choice_a_job_goes_to_every_partition_of_its_pool_with_its_defaults(
    pool: SlurmPool, alice: User
) -> None:
    job = create_job(
        alice, check_job_request({**job_request(instances=2), "pool": "site"}), None, None
    )
    assert job.slurm_options == {}
    argv = slurm_batch.sbatch_argv(job, slurm_batch.target_of(pool), Path("/x/batch.py"))
    assert "--partition=gpuq,long" in argv
    assert {"--account=ml", "--qos=normal", "--constraint=ib"} <= set(argv)
    assert "--exclusive" not in argv


def test_an_account_is_the_jobs_choice_then_the_persons_then_the_pools() -> None:
    defaults: dict[str, str | bool] = {"account": "ml", "exclusive": True}
    assert slurm_choices.sbatch_options(defaults, SlurmChoices()) == [
        "--account=ml",
        "--exclusive",
    ]
    assert slurm_choices.sbatch_options(defaults, SlurmChoices(), "vision")[0] == (
        "--account=vision"
    )
    chosen = SlurmChoices(account="speech", exclusive=False)
    # A pool that gives whole nodes gives them whatever the job says.
    assert slurm_choices.sbatch_options(defaults, chosen, "vision") == [
        "--account=speech",
        "--exclusive",
    ]


def test_the_catalog_says_what_a_job_may_choose(pool: SlurmPool) -> None:
    assert slurm_choices.allowed(pool) == {
        "partition": ["gpuq", "long"],
        "account": ["vision", "speech"],
        "qos": ["normal", "high"],
        "constraint": ["ib&a100", "ib|v100"],
        "reservation": [],
        "exclusive": False,
    }
    pool.partition = "gpuq"
    assert slurm_choices.allowed(pool)["partition"] == []


def test_a_person_with_their_own_account_on_a_run_as_owner_pool_keeps_the_jobs_choice(
    pool: SlurmPool, alice: User, settings: Any
) -> None:
    settings.TRAINYARD_SLURM_SUBMIT_AS = "options"
    job = create_job(
        alice,
        check_job_request(
            {**job_request(instances=2), "pool": "site", "slurm": {"account": "speech"}}
        ),
        None,
        None,
    )
    person = Identity("alice", 2000, 2000, "vision")
    argv = slurm_batch.sbatch_argv(job, slurm_batch.target_of(pool), Path("/x/b.py"), person)
    assert [a for a in argv if a.startswith(("--account", "--uid", "--gid"))] == [
        "--uid=2000",
        "--gid=2000",
        "--account=speech",
    ]
    # Where sbatch is run as the person instead, it gets no --uid/--gid: it is them.
    settings.TRAINYARD_SLURM_SUBMIT_AS = "person"
    argv = slurm_batch.sbatch_argv(job, slurm_batch.target_of(pool), Path("/x/b.py"), person)
    assert [a for a in argv if a.startswith(("--account", "--uid", "--gid"))] == [
        "--account=speech"
    ]
