"""Django's SQLite backend, with write transactions that queue instead of polling.

SQLite lets one writer in at a time. A connection that finds the write lock taken does not
wait in line: its busy handler sleeps and tries again, with sleeps growing to 100 ms, so under
contention (several submissions at once, the console worker placing jobs) a writer can lose
the race again and again, and the slowest submission waited seconds while the lock was free
most of the time. Here every write transaction first takes an exclusive `flock` on a file
beside the database: the kernel wakes a waiter the moment the holder lets go, so writers take
turns without idle gaps. The gate is released when the transaction commits or rolls back, and
by the kernel if the process dies. Writes outside a transaction still meet SQLite's own lock.
"""

import fcntl
import os
from typing import Any

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    _gate_fd: int | None = None
    _gate_held = False

    def _start_transaction_under_autocommit(self) -> None:
        self._take_gate()
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
        except BaseException:
            self._release_gate()
            raise

    def _commit(self) -> Any:
        try:
            return super()._commit()  # type: ignore[misc]
        finally:
            self._release_gate()

    def _rollback(self) -> Any:
        try:
            return super()._rollback()  # type: ignore[misc]
        finally:
            self._release_gate()

    def _close(self) -> Any:
        try:
            return super()._close()  # type: ignore[misc]
        finally:
            self._release_gate()
            if self._gate_fd is not None:
                os.close(self._gate_fd)
                self._gate_fd = None

    def _take_gate(self) -> None:
        # Only write transactions queue (IMMEDIATE takes the write lock at BEGIN); an in-memory
        # database belongs to one connection and has no one to queue with.
        if getattr(self, "transaction_mode", None) != "IMMEDIATE" or self.is_in_memory_db():
            return
        if self._gate_fd is None:
            path = f"{self.settings_dict['NAME']}.write-gate"
            self._gate_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._gate_fd, fcntl.LOCK_EX)
        self._gate_held = True

    def _release_gate(self) -> None:
        if self._gate_held and self._gate_fd is not None:
            fcntl.flock(self._gate_fd, fcntl.LOCK_UN)
        self._gate_held = False
