"""Pages of the job list, read by keyset, not by offset.

A page starts after (or ends before) the job a cursor names, in the list's own sort order:
`WHERE (created, id) < (the cursor's)` read off the (owner, created, id) index costs the same
on the first page and the thousandth, where `OFFSET n` reads and throws away n rows, and a job
submitted meanwhile neither repeats a row nor hides one. With 100,000 jobs in history the list
spent its time on COUNT and OFFSET (issue 24). The total is counted up to COUNT_CAP only.

A cursor is opaque to clients: base64url of JSON `[sort, direction, key, id]`, where `key` is
the sort's value at that job (its submission time, or how long it ran in microseconds, or
null for a job that never started). Anything else is refused as a bad cursor.

The run table's column sorts (a metric's best value, a config key: job_search.Column) page
by position instead, `[sort, "at", offset]`: their values are of any type and come from
another table, and the lists they serve are a user's runs, a few thousand at most.
"""

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet

from jobs.models import Job

COUNT_CAP = 10_000  # jobs counted at most: beyond that a list says "10,000+"
MAX_CURSOR = 200  # characters: a cursor the console made is well under this

AFTER, BEFORE = "after", "before"
AT = "at"  # a column sort's cursor: the position the page starts at
BAD_CURSOR = "cursor is not one this list gave: start again without it."
MAX_OFFSET = 10**9


class BadCursor(Exception):
    """A cursor this list cannot take; the message says why."""


@dataclass(frozen=True)
class Page:
    jobs: list[Job]
    next: str | None  # the cursor of the page after this one in the list's order, if any
    previous: str | None  # the cursor of the page before it, if any


@dataclass(frozen=True)
class _Order:
    field: str  # "created", or the "ran" annotation of jobs.services.views.job_search
    descending: bool
    nullable: bool  # a job that never started has no duration: those come last


_ORDERS = {
    "-submitted": _Order("created", descending=True, nullable=False),
    "submitted": _Order("created", descending=False, nullable=False),
    "-duration": _Order("ran", descending=True, nullable=True),
    "duration": _Order("ran", descending=False, nullable=True),
}


def read_page(jobs: QuerySet[Job], sort: str, limit: int, cursor: str = "") -> Page:
    """Up to `limit` of `jobs` (already filtered and ordered by job_search.apply for `sort`),
    after or before the job `cursor` names; the first page without one."""
    if sort not in _ORDERS:
        return _read_at(jobs, sort, limit, _decode_at(cursor, sort) if cursor else 0)
    order = _ORDERS[sort]
    if not cursor:
        rows = list(jobs[: limit + 1])
        more = len(rows) > limit
        rows = rows[:limit]
        return Page(rows, _cursor(sort, AFTER, order, rows[-1]) if more else None, None)
    direction, key, pk = _decode(cursor, sort)
    if direction == AFTER:
        rows = list(jobs.filter(_after(order, key, pk))[: limit + 1])
        more = len(rows) > limit
        rows = rows[:limit]
        following = _cursor(sort, AFTER, order, rows[-1]) if more else None
        # Something came before the job the cursor names: at least that job.
        return Page(rows, following, _cursor(sort, BEFORE, order, rows[0]) if rows else None)
    rows = list(jobs.filter(_before(order, key, pk)).reverse()[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit][::-1]
    preceding = _cursor(sort, BEFORE, order, rows[0]) if more else None
    return Page(rows, _cursor(sort, AFTER, order, rows[-1]) if rows else None, preceding)


def _read_at(jobs: QuerySet[Job], sort: str, limit: int, start: int) -> Page:
    rows = list(jobs[start : start + limit + 1])
    more = len(rows) > limit
    return Page(
        rows[:limit],
        _cursor_at(sort, start + limit) if more else None,
        _cursor_at(sort, max(0, start - limit)) if start > 0 else None,
    )


def _cursor_at(sort: str, start: int) -> str:
    return _encode([sort, AT, start])


def _decode_at(cursor: str, sort: str) -> int:
    """The position a column sort's cursor starts at, or BadCursor."""
    kind, start = _fields(cursor, sort, 2)
    if kind != AT or type(start) is not int or not 0 <= start <= MAX_OFFSET:
        raise BadCursor(BAD_CURSOR)
    return start


def capped_count(jobs: QuerySet[Job]) -> tuple[int, bool]:
    """How many jobs there are, counting to COUNT_CAP at most, and whether there are more."""
    counted = jobs.order_by()[: COUNT_CAP + 1].count()
    return min(counted, COUNT_CAP), counted > COUNT_CAP


def _after(order: _Order, key: Any, pk: int) -> Q:
    """The jobs that come after (key, pk) in `order` (then by id the same way, nulls last)."""
    past = "lt" if order.descending else "gt"
    if key is None:
        return Q(**{f"{order.field}__isnull": True, f"pk__{past}": pk})
    later = Q(**{f"{order.field}__{past}": key}) | Q(**{order.field: key, f"pk__{past}": pk})
    return later | Q(**{f"{order.field}__isnull": True}) if order.nullable else later


def _before(order: _Order, key: Any, pk: int) -> Q:
    """The jobs that come before (key, pk) in `order`."""
    ahead = "gt" if order.descending else "lt"
    if key is None:
        return Q(**{f"{order.field}__isnull": False}) | Q(
            **{f"{order.field}__isnull": True, f"pk__{ahead}": pk}
        )
    return Q(**{f"{order.field}__{ahead}": key}) | Q(**{order.field: key, f"pk__{ahead}": pk})


def _cursor(sort: str, direction: str, order: _Order, job: Job) -> str:
    value = getattr(job, order.field)
    if isinstance(value, datetime):
        key: Any = value.isoformat()
    elif isinstance(value, timedelta):
        key = value // timedelta(microseconds=1)
    else:
        key = None
    return _encode([sort, direction, key, job.pk])


def _encode(fields: list[Any]) -> str:
    """A cursor: its fields (the sort first) as base64url of compact JSON, unpadded."""
    raw = json.dumps(fields, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _fields(cursor: str, sort: str, count: int) -> list[Any]:
    """The `count` fields after the sort of a cursor made for `sort`, or BadCursor."""
    if len(cursor) > MAX_CURSOR:
        raise BadCursor(BAD_CURSOR)
    try:
        made_for, *fields = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, TypeError, binascii.Error):
        raise BadCursor(BAD_CURSOR) from None
    if len(fields) != count:
        raise BadCursor(BAD_CURSOR)
    if made_for != sort:
        raise BadCursor(f"cursor belongs to sort {made_for}, not {sort}: start again without it.")
    return fields


def _decode(cursor: str, sort: str) -> tuple[str, Any, int]:
    """(direction, key, id) from a cursor made for `sort`, or BadCursor."""
    bad = BadCursor(BAD_CURSOR)
    direction, key, pk = _fields(cursor, sort, 3)
    if direction not in (AFTER, BEFORE) or type(pk) is not int or not 0 < pk < 2**63:
        raise bad
    order = _ORDERS[sort]
    if order.field == "created":
        if not isinstance(key, str):
            raise bad
        try:
            moment = datetime.fromisoformat(key)
        except ValueError:
            raise bad from None
        if moment.tzinfo is None:
            raise bad
        return direction, moment, pk
    if key is None:
        return direction, None, pk
    if type(key) is not int or not -(2**62) < key < 2**62:
        raise bad
    return direction, timedelta(microseconds=key), pk
