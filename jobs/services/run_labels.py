"""Filing runs (issue 49): the one writer of a job's tags, project and note, whether they come
with its submission (JobIn's `tags`, `project`, `note`), from its page, the API
(`PATCH /api/v1/jobs/ID/labels`) or `trainyard tag JOB +a -b`. Each change is checked whole
first (jobs.labels): a refusal names every problem and changes nothing.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.db import transaction

from jobs import labels
from jobs.models import Job, JobTag


class LabelError(Exception):
    """What a change cannot take: {field: [message]} (the API's 400 shape)."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(" ".join(m for ms in errors.values() for m in ms))
        self.errors = errors


@dataclass(frozen=True)
class Filing:
    """What a run is filed under when it is submitted."""

    project: str = ""
    tags: tuple[str, ...] = ()
    note: str = ""


def check_filing(
    tags: Sequence[str] | None, project: str | None, note: str | None
) -> tuple[Filing, dict[str, list[str]]]:
    """A submission's filing, and its problems by field (none: an empty dict)."""
    errors: dict[str, list[str]] = {}
    wanted = _tag_list(tags or (), "tags", errors)
    if len(wanted) > labels.TAGS_PER_JOB:
        errors.setdefault("tags", []).append(f"A job has at most {labels.TAGS_PER_JOB} tags.")
    project = (project or "").strip()
    if problem := labels.project_problem(project):
        errors["project"] = [problem]
    note = note or ""
    if problem := labels.note_problem(note):
        errors["note"] = [problem]
    return Filing(project, tuple(wanted), note), errors


def file_new_job(job: Job, filing: Filing) -> None:
    """Write a new job's tags (its project and note are columns of its row, written with it)."""
    JobTag.objects.bulk_create(JobTag(job=job, label=tag) for tag in filing.tags)


def change(
    job_id: int,
    *,
    add: Iterable[str] = (),
    remove: Iterable[str] = (),
    project: str | None = None,
    note: str | None = None,
) -> Job:
    """Add and remove tags, and set the project and the note where given (None: as they
    are); the job as it is then. Removing a tag the job does not have is no error."""
    errors: dict[str, list[str]] = {}
    adding = _tag_list(add, "add", errors)
    removing = _tag_list(remove, "remove", errors)
    if both := set(adding) & set(removing):
        errors.setdefault("tags", []).append(
            f"Add or remove a tag, not both: {', '.join(sorted(both))}."
        )
    if project is not None:
        project = project.strip()
        if problem := labels.project_problem(project):
            errors["project"] = [problem]
    if note is not None and (problem := labels.note_problem(note)):
        errors["note"] = [problem]
    if errors:
        raise LabelError(errors)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        JobTag.objects.filter(job=job, label__in=removing).delete()
        have = set(JobTag.objects.filter(job=job).values_list("label", flat=True))
        new = [t for t in adding if t not in have]
        if len(have) + len(new) > labels.TAGS_PER_JOB:
            raise LabelError(
                {"add": [f"A job has at most {labels.TAGS_PER_JOB} tags; it has {len(have)}."]}
            )
        JobTag.objects.bulk_create(JobTag(job=job, label=t) for t in new)
        changed: list[str] = []
        if project is not None and project != job.project:
            job.project, changed = project, [*changed, "project"]
        if note is not None and note != job.note:
            job.note, changed = note, [*changed, "note"]
        if changed:
            job.save(update_fields=changed)
    return job


def tags_of(job: Job) -> list[str]:
    """The job's tags in order: the prefetched ones where a list fetched them."""
    cache = getattr(job, "_prefetched_objects_cache", {})
    rows = cache["tags"] if "tags" in cache else job.tags.all()
    return sorted(t.label for t in rows)


def _tag_list(raw: Iterable[str], field: str, errors: dict[str, list[str]]) -> list[str]:
    """Tags given, stripped and without repeats, each one's problem noted under `field`."""
    tags = list(dict.fromkeys(str(t).strip() for t in raw))
    for tag in tags:
        if problem := labels.tag_problem(tag):
            errors.setdefault(field, []).append(problem)
    return tags
