"""Rows as the database driver gives them, for the few reads where Django's per-value
converters cost more than the work done with the values: a scheduling pass reads the order of
10,000 waiting jobs and the state of 1,000 nodes (issue 24)."""

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import DateTimeField, QuerySet
from django.db.models.sql.constants import MULTI


def plain_rows(query: "QuerySet[Any]") -> list[tuple[Any, ...]]:
    """The query's rows as the database driver returns them, without Django's per-value
    converters (a JSON decoding, a date parsed in Python): the caller converts the few values
    that need it (`aware_dates`)."""
    compiler = query.query.get_compiler(query.db)
    rows: list[tuple[Any, ...]] = []
    for chunk in compiler.execute_sql(MULTI):
        rows.extend(chunk)
    return rows


_A_DATE = DateTimeField()


def aware_dates(database: str) -> Callable[[Any], datetime]:
    """A date column's value as the model has it: PostgreSQL's driver gives it so, SQLite's
    gives naive UTC (the connection's zone), or text."""
    connection = connections[database]
    zone = connection.timezone

    def aware(value: Any) -> datetime:
        if isinstance(value, datetime):
            return value if value.tzinfo is not None else value.replace(tzinfo=zone)
        converted = connection.ops.convert_datetimefield_value(  # type: ignore[attr-defined]
            value, _A_DATE, connection
        )
        assert isinstance(converted, datetime)
        return converted

    return aware
