"""Fresh, empty databases for races and benchmarks: an SQLite file, or a PostgreSQL database
created on the server at TRAINYARD_TEST_POSTGRES (default 127.0.0.1:5432, user postgres) and
dropped afterwards."""

import json
import os
import secrets
import shutil
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
def fresh_sqlite(folder: Path, template: Path | None = None) -> Iterator[str]:
    """A new SQLite file: empty, or a copy of `template` (migrated_sqlite)."""
    path = folder / f"race-{secrets.token_hex(4)}.sqlite3"
    if template is not None:
        shutil.copyfile(template, path)
    yield f"sqlite:///{path}"


def migrate(database_url: str, redis_url: str = "") -> None:
    """Migrate the database and load the starter catalog, as a console's first start does."""
    env = dict(os.environ, DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="console.settings")
    if redis_url:
        env["REDIS_URL"] = redis_url
    for command in (["migrate", "--noinput"], ["load_catalog"]):
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *command],
            cwd=ROOT, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {command[0]} failed:\n{done.stderr[-3000:]}")


def migrated_sqlite(folder: Path, redis_url: str = "") -> Path:
    """An SQLite file migrated once, for fresh_sqlite to copy: a bench that needs many fresh
    databases does not migrate each (issue 24: make bench-scale in under 15 minutes)."""
    path = folder / "template.sqlite3"
    migrate(f"sqlite:///{path}", redis_url)
    return path


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
def fresh_postgres(template: str | None = None) -> Iterator[str]:
    """A new PostgreSQL database: empty, or a copy of the database named `template`
    (migrated_postgres)."""
    import psycopg
    from psycopg import sql

    name = f"trainyard_race_{secrets.token_hex(4)}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(create)
    base, _, _ = POSTGRES_ADMIN_URL.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextmanager
def migrated_postgres(redis_url: str = "") -> Iterator[str]:
    """The name of a PostgreSQL database migrated once, for fresh_postgres to copy (CREATE
    DATABASE ... TEMPLATE: a file copy on the server, no migrations run again)."""
    with fresh_postgres() as url:
        migrate(url, redis_url)
        yield url.rpartition("/")[2]


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
