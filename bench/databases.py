"""Fresh, empty databases for races and benchmarks: an SQLite file, or a PostgreSQL database
created on the server at TRAINYARD_TEST_POSTGRES (default 127.0.0.1:5432, user postgres) and
dropped afterwards."""

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_ADMIN_URL = os.environ.get(
    "TRAINYARD_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@contextmanager
def fresh_sqlite(folder: Path) -> Iterator[str]:
    path = folder / f"race-{secrets.token_hex(4)}.sqlite3"
    yield f"sqlite:///{path}"


def postgres_unreachable_reason() -> str | None:
    """Why PostgreSQL can't be used here, or None when it can."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        with psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return f"no PostgreSQL at {POSTGRES_ADMIN_URL}: {str(exc).strip()}"


@contextmanager
def fresh_postgres() -> Iterator[str]:
    import psycopg
    from psycopg import sql

    name = f"trainyard_race_{secrets.token_hex(4)}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base, _, _ = POSTGRES_ADMIN_URL.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def measured_in_fresh_process(module: str, *args: str) -> dict[str, Any]:
    """Run `python -m module ARGS --json` and return the JSON of its last line: a measurement
    against another database needs a process of its own, since Django binds one database per
    process."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args, "--json"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"{module} {' '.join(args[:1])} did not run:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
