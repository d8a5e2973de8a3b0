"""Per-epoch figures of every worker, gathered at the scheduler for worker 0 to print.

DDP's rank 0 prints job-wide lines (mean loss over all samples, summed throughput) after an
all-reduce. A collective among workers would make every worker wait for the slowest one at each
epoch end, which is what dist_async exists to avoid. So each worker posts its figures to the
scheduler's store and worker 0 reads them once they are complete: right away in the sync modes
(the workers are in step anyway), whenever they are there in dist_async, catching up at the end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from workers.ps.config import WORKER, label
from workers.ps.session import Session


def figures_key(epoch: int, worker: int) -> str:
    return f"ps/epoch/{epoch}/{worker}"


class EpochBoard:
    def __init__(self, session: Session) -> None:
        self._session = session
        self._workers = session.topo.num_workers
        self._next = 1  # the first epoch not yet returned by collect()

    def post(self, epoch: int, figures: Sequence[float]) -> None:
        """Publish this worker's figures for `epoch` (1-based); floats survive JSON exactly."""
        me = self._session.topo.index
        self._session.store.set(figures_key(epoch, me), json.dumps([float(x) for x in figures]))

    def collect(self, through: int | None = None) -> list[tuple[int, list[list[float]]]]:
        """Epochs not returned before whose figures are complete, in order, each with one row
        per worker (by index). With `through`, first wait (bounded by the timeout) until every
        epoch up to `through` is complete."""
        store = self._session.store
        done: list[tuple[int, list[list[float]]]] = []
        while True:
            epoch = self._next
            keys = [figures_key(epoch, w) for w in range(self._workers)]
            if not store.check(keys):
                if through is None or epoch > through:
                    return done
                self._session.wait_for_keys(
                    keys,
                    self._session.topo.timeout_s,
                    f"every worker's figures for epoch {epoch}",
                    lambda absent: ", ".join(
                        label(WORKER, int(k.rsplit("/", 1)[1])) for k in absent
                    ),
                )
            rows = [json.loads(v) for v in store.multi_get(keys)]
            done.append((epoch, rows))
            self._next += 1
