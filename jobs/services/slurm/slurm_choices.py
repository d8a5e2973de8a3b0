"""What a job of a Slurm pool may choose of Slurm's options, within what the pool's admin
allows, and what sbatch is then sent.

A pool sets what every job is sent with (its account, QOS, constraint, reservation,
exclusive: the site's defaults) and, beside them, what a job may choose instead: one of the
pool's partitions where it lists several, an account, a QOS, a constraint or a reservation
from the admin's lists, and --exclusive where the admin allows it. A choice outside them is
refused at submission with what is allowed; nothing a job sends reaches sbatch otherwise.
"""

from dataclasses import asdict, dataclass
from typing import Any

from jobs.models import SlurmPool

# The options a job may choose a value of, in the order sbatch gets them, and the pool's
# field that lists the values its admin allows.
CHOSEN = {
    "account": "job_accounts",
    "qos": "job_qos",
    "constraint": "job_constraints",
    "reservation": "job_reservations",
}


@dataclass(frozen=True)
class SlurmChoices:
    """A job's own Slurm options; "" and None leave the pool's."""

    partition: str = ""
    account: str = ""
    qos: str = ""
    constraint: str = ""
    reservation: str = ""
    exclusive: bool | None = None

    def stored(self) -> dict[str, object]:
        """As Job.slurm_options keeps it: only what the job chose."""
        return {key: value for key, value in asdict(self).items() if value not in ("", None)}

    @classmethod
    def of(cls, stored: dict[str, Any] | None) -> "SlurmChoices":
        known = {key: value for key, value in (stored or {}).items() if key in FIELDS}
        return cls(**known)


FIELDS = tuple(SlurmChoices.__dataclass_fields__)


def partitions_of(pool: SlurmPool) -> list[str]:
    """The pool's partitions, in its admin's order (Slurm's own comma-separated list)."""
    return [name for name in pool.partition.split(",") if name]


def listed(text: str) -> list[str]:
    """An admin's list of allowed values: separated by spaces (a constraint may hold commas)."""
    return text.split()


def allowed(pool: SlurmPool) -> dict[str, object]:
    """What a job of the pool may choose: the catalog's and the form's answer."""
    return {
        "partition": partitions_of(pool) if len(partitions_of(pool)) > 1 else [],
        **{option: listed(getattr(pool, field)) for option, field in CHOSEN.items()},
        "exclusive": pool.exclusive or pool.job_exclusive,
    }


def check(pool: SlurmPool, raw: dict[str, Any]) -> tuple[SlurmChoices, list[str]]:
    """A job's choices checked against its pool; the problems found, each saying what the
    pool allows. Types are the schema's (strings, and a bool for exclusive)."""
    problems: list[str] = []
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        problems.append(f"Unknown Slurm options {', '.join(unknown)}; known: {', '.join(FIELDS)}.")
    chosen: dict[str, Any] = {}
    partition = raw.get("partition") or ""
    if partition:
        partitions = partitions_of(pool)
        if partition not in partitions:
            problems.append(
                f"Pool {pool.name} has no partition {partition!r}; it has {', '.join(partitions)}."
            )
        chosen["partition"] = partition
    for option, field in CHOSEN.items():
        value = raw.get(option) or ""
        if not value:
            continue
        choices = listed(getattr(pool, field))
        if value not in choices and value != getattr(pool, option):
            offered = ", ".join(choices) if choices else "none: the pool's own only"
            problems.append(
                f"Pool {pool.name} does not let a job choose {option} {value!r}; it allows "
                f"{offered}."
            )
        chosen[option] = value
    exclusive = raw.get("exclusive")
    if exclusive and not (pool.exclusive or pool.job_exclusive):
        problems.append(f"Pool {pool.name} does not let a job ask for whole nodes (exclusive).")
    if exclusive is not None:
        chosen["exclusive"] = bool(exclusive)
    return SlurmChoices(**chosen), problems


def partition_for(pool_partitions: str, choices: SlurmChoices) -> str:
    """sbatch --partition: the job's choice, or the pool's whole list (Slurm starts the job
    in whichever of them can start it first)."""
    return choices.partition or pool_partitions


def sbatch_options(
    defaults: dict[str, str | bool], choices: SlurmChoices, own_account: str = ""
) -> list[str]:
    """The site's options with the job's choices in their place. `defaults`: the pool's
    (account, qos, constraint, reservation, exclusive); `own_account`: the person's own Slurm
    account (a pool whose jobs run as their owners), before the pool's, after the job's."""
    options: list[str] = []
    for option in CHOSEN:
        value = getattr(choices, option) or (own_account if option == "account" else "")
        value = value or str(defaults.get(option) or "")
        if value:
            options.append(f"--{option}={value}")
    # A pool that gives whole nodes gives them to every job; a job may only ask for more.
    if defaults.get("exclusive") or choices.exclusive:
        options.append("--exclusive")
    return options
