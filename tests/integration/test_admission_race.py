"""Racing submissions never over-admit: 8 processes x 20 jobs against a quota that admits 50,
on SQLite and on PostgreSQL, bound by a user's own quota and by a group's shared one."""

from pathlib import Path

import pytest

from bench.admission import race_in_subprocess
from bench.databases import fresh_postgres, fresh_sqlite
from tests.conftest import require_postgres

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("scope", ["user", "group"])
def test_sqlite_race_never_over_admits(scope: str, tmp_path: Path, redis_server: str) -> None:
    with fresh_sqlite(tmp_path) as url:
        result = race_in_subprocess(url, redis_server, "sqlite", scope)
    print("\n" + result.summary())
    assert result.errors == []
    assert (result.attempts, result.admitted, result.rejected) == (160, 50, 110)
    assert result.active_in_db == 50 and result.over_admitted == 0


@pytest.mark.postgres
@pytest.mark.parametrize("scope", ["user", "group"])
def test_postgres_race_never_over_admits(scope: str, redis_server: str) -> None:
    require_postgres()
    with fresh_postgres() as url:
        result = race_in_subprocess(url, redis_server, "postgresql", scope)
    print("\n" + result.summary())
    assert result.errors == []
    assert (result.attempts, result.admitted, result.rejected) == (160, 50, 110)
    assert result.active_in_db == 50 and result.over_admitted == 0
