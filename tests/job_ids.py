"""Run inside a stack's `manage.py shell`: make the next job id `first` (see
tests/conftest.number_jobs_apart)."""

from django.db import connection

from jobs.models import Job


def start_at(first: int) -> None:
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            # Django's SQLite ids are AUTOINCREMENT: the next one follows sqlite_sequence's.
            cursor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])
            cursor.execute(
                "INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, first - 1]
            )
        else:
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", [table, first - 1]
            )
