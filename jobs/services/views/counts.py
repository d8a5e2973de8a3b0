"""How many instances a job has, said one way on the list, the job page, the API and the CLI.

The truth is every process the job runs: the instances the user asked for, role by role, and
the ones the platform adds by itself (a parameter-server job's scheduler). The two are said
apart, "5 (4 trainers + scheduler)", because only the first are charged and counted against the
quota, and because counting either alone is how the list and `trainyard ls` came to disagree.
Counted from what was asked, not from the replica rows: a restarted job has rows for every
attempt.
"""

from dataclasses import dataclass

from jobs.models import PLATFORM_ROLES, Job
from jobs.services.views.presenters import related


@dataclass(frozen=True)
class InstanceCount:
    trainers: int  # the instances the user asked for, over the roles (elastic: the most)
    platform: tuple[str, ...]  # the roles the platform adds, one instance each
    fewest: int | None = None  # an elastic job's fewest trainers; None: a fixed count

    @property
    def total(self) -> int:
        return self.trainers + len(self.platform)

    @property
    def text(self) -> str:
        """ "3"; "5 (4 trainers + scheduler)" where the platform adds its own; an elastic
        job's "2-4 (elastic)"."""
        if self.fewest is not None:
            extra = f" + {' + '.join(self.platform)}" if self.platform else ""
            return f"{self.fewest}-{self.trainers} (elastic){extra}"
        if not self.platform:
            return str(self.total)
        trainers = f"{self.trainers} trainer{'' if self.trainers == 1 else 's'}"
        return f"{self.total} ({' + '.join((trainers, *self.platform))})"


def instance_count(job: Job) -> InstanceCount:
    asked = related(job, "roles", job.roles.all)
    return InstanceCount(
        trainers=sum(r.instances for r in asked),
        platform=tuple(r for r in job.image.roles if r in PLATFORM_ROLES),
        fewest=job.min_size if job.is_elastic else None,
    )
