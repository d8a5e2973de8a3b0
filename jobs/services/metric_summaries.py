"""Each job's metrics in brief: per name, the final value and the lowest and highest reported
(models.MetricSummary), folded in by the log keeper as it archives points
(jobs.services.logarchive), in the transaction that saves them.

The run table sorts by these (jobs.services.views.run_table): reading every job's points on
every page load would cost the whole metric history. `final` is read as figures.final_value
reads it, the mean of the reports at the last step (or, without steps, the last report);
"best" is the lowest for a metric that gets better going down (a loss, an error) and the
highest for the others.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from jobs.models import MetricPoint, MetricSummary

# Words in a metric's name that say it gets better going down.
_LOWER_IS_BETTER_WORDS = ("loss", "error", "perplexity", "latency", "seconds", "time")


def lower_is_better(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _LOWER_IS_BETTER_WORDS)


def best_field(name: str) -> str:
    """The MetricSummary field that holds a metric's best value."""
    return "minimum" if lower_is_better(name) else "maximum"


@dataclass
class Fold:
    """A summary as it is folded: a MetricSummary's numbers without its row."""

    final_step: int = 0
    final_sum: float = 0.0
    final_count: int = 0
    minimum: float = float("inf")
    maximum: float = float("-inf")
    points: int = 0
    through_cursor: int = -1

    @property
    def final(self) -> float:
        return self.final_sum / self.final_count if self.final_count else 0.0

    def add(self, cursor: int, value: float, step: int | None) -> None:
        """Fold in one point; one already folded (at or before `through_cursor`) is skipped."""
        if cursor <= self.through_cursor:
            return
        at = step or 0
        if self.final_count == 0 or at > self.final_step:
            self.final_step, self.final_sum, self.final_count = at, 0.0, 0
        if at == self.final_step:
            self.final_sum += value
            self.final_count += 1
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)
        self.points += 1
        self.through_cursor = cursor


_FIELDS = ("final_step", "final_sum", "final_count", "minimum", "maximum", "points")


def record(job_id: int, points: Iterable[MetricPoint]) -> None:
    """Fold newly archived points of one job into its summaries. Call inside the transaction
    that saves them: a batch archived again (by a keeper that crashed before acknowledging
    it) is skipped point by point, by cursor."""
    by_name: dict[str, list[MetricPoint]] = {}
    for point in sorted(points, key=lambda p: p.cursor):
        by_name.setdefault(point.name, []).append(point)
    if not by_name:
        return
    existing = {
        s.name: s
        for s in MetricSummary.objects.select_for_update().filter(
            job_id=job_id, name__in=list(by_name)
        )
    }
    created: list[MetricSummary] = []
    changed: list[MetricSummary] = []
    for name, named in by_name.items():
        row = existing.get(name)
        fold = _fold_of(row) if row is not None else Fold()
        for point in named:
            fold.add(point.cursor, point.value, point.step)
        if fold.points == 0:
            continue
        if row is None:
            created.append(MetricSummary(job_id=job_id, name=name, **as_fields(fold)))
        else:
            for field, value in as_fields(fold).items():
                setattr(row, field, value)
            changed.append(row)
    MetricSummary.objects.bulk_create(created)
    MetricSummary.objects.bulk_update(changed, [*_FIELDS, "final", "through_cursor"])


def as_fields(fold: Fold) -> dict[str, float | int]:
    """A fold as a MetricSummary's field values."""
    fields: dict[str, float | int] = {f: getattr(fold, f) for f in _FIELDS}
    return {**fields, "final": fold.final, "through_cursor": fold.through_cursor}


def _fold_of(row: MetricSummary) -> Fold:
    return Fold(**{f: getattr(row, f) for f in (*_FIELDS, "through_cursor")})
