"""The database's query planner statistics, kept fresh by the console worker (SQLite only).

SQLite plans a query from the statistics ANALYZE leaves in `sqlite_stat1`, and a database that
never had ANALYZE run on it has none: with 10,000 waiting jobs it read the queue's order by a
worse plan, and a scheduling pass took 165 ms where 62 ms did with statistics (issue 24). SQLite
asks long-running applications to refresh them now and then; `analysis_limit` bounds the work
to a sample of each index. PostgreSQL's autovacuum
does the same there by itself: nothing is done for it.
"""

import logging

from django.db import connection

from jobs.services.periodic import PeriodicPass

log = logging.getLogger(__name__)

# Rows sampled per index: a bound on the work at any size (12 ms at 11,000 jobs, without it a
# second at a million). At SQLite's suggested 1,000 the estimates for the queue's index were
# five times off; at 10,000 they are close to a full ANALYZE's.
ANALYSIS_LIMIT = 10000


def refresh() -> bool:
    """Gather fresh statistics; whether this database needed it from us."""
    if connection.vendor != "sqlite":
        return False
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA analysis_limit={ANALYSIS_LIMIT}")
        cursor.execute("ANALYZE")
    return True


class StatisticsLoop(PeriodicPass[bool]):
    """Refreshes the statistics when the console worker starts, then every `interval`
    seconds, until stopped."""

    what = "planner statistics"

    def one_pass(self) -> bool:
        return refresh()

    def run(self) -> None:
        self.run_once()  # a console started on a database it has not analyzed yet
        super().run()
