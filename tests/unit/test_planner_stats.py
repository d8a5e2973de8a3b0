"""SQLite's query planner statistics, refreshed by the console worker (planner_stats)."""

import pytest
from django.db import connection

from jobs.models import Node
from jobs.services import planner_stats


@pytest.mark.django_db
def test_refresh_leaves_statistics_for_the_planner(nodes: list[Node]) -> None:
    if connection.vendor != "sqlite":
        assert planner_stats.refresh() is False  # PostgreSQL's autovacuum keeps its own
        return
    assert planner_stats.refresh() is True
    with connection.cursor() as cursor:
        tables = {row[0] for row in cursor.execute("SELECT tbl FROM sqlite_stat1").fetchall()}
    assert "jobs_node" in tables  # (an empty table has none to keep)


@pytest.mark.django_db
def test_the_loop_refreshes_once_when_it_starts_and_says_so() -> None:
    assert planner_stats.StatisticsLoop(3600).run_once() is (connection.vendor == "sqlite")
