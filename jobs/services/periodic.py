"""Work the console worker does every so often on a timer thread of its own (reconciliation,
retention): one pass at a time, and a pass that fails is logged and the next one tries again."""

import logging
import threading
from typing import Generic, TypeVar

from django.db import close_old_connections

log = logging.getLogger(__name__)

Report = TypeVar("Report")


class PeriodicPass(threading.Thread, Generic[Report]):
    """Runs `one_pass` every `interval` seconds until stopped."""

    what = "pass"  # said in the log: "reconciliation", "retention"
    # Whether the first pass runs as the loop starts rather than an interval later: for a pass
    # that picks up what a killed worker had in hand.
    pass_at_start = False

    def __init__(self, interval: float) -> None:
        super().__init__(name=self.what, daemon=True)
        self.interval = interval
        self.stopped = threading.Event()

    def one_pass(self) -> Report | None:
        raise NotImplementedError

    def run(self) -> None:
        log.info("%s every %.1f s", self.what, self.interval)
        if self.pass_at_start:
            self.run_once()
        while not self.stopped.wait(self.interval):
            self.run_once()

    def run_once(self) -> Report | None:
        # Each pass may find the database connection closed by the server since the last one.
        close_old_connections()
        try:
            return self.one_pass()
        except Exception:  # the loop must outlive any one bad pass; the next one tries again
            log.exception("%s pass failed", self.what)
            return None
        finally:
            close_old_connections()

    def stop(self) -> None:
        self.stopped.set()
