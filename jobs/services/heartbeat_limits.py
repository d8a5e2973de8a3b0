"""Heartbeats that a misbehaving agent sends too often, or too large, are refused before they
cost the console a database write, so that one agent cannot slow the others (issue 24, item 5).

- Too large: a running list (or list of finished replicas) longer than any node could hold
  (TRAINYARD_HEARTBEAT_MAX_ENTRIES) is refused before its signature is even checked: checking
  it means serialising the whole payload.
- Too often: of one agent incarnation's heartbeats, one in TRAINYARD_HEARTBEAT_MIN_SPACING_SECONDS
  is taken, the rest are dropped. Judged after the signature holds, so that a forged
  heartbeat naming a node cannot use up that node's turn. A new incarnation (a restarted
  agent) is always taken at once: its first heartbeat is how the console learns of it.

A refusal is logged once a minute per node at most, with how many were refused since. The
counts are per console worker process: with two workers an agent gets twice the rate at most.
"""

import logging
import threading
import time
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 60.0


class _Gate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[str, float]] = {}  # node -> (incarnation, monotonic time)
        self._refused: dict[str, tuple[int, float]] = {}  # node -> (count, last logged)

    def too_large(self, payload: dict[str, Any]) -> bool:
        limit = settings.TRAINYARD_HEARTBEAT_MAX_ENTRIES
        for field in ("running", "finished"):
            entries = payload.get(field)
            if isinstance(entries, list) and len(entries) > limit:
                self._refuse(
                    str(payload.get("node", "")),
                    f"its {field} list has {len(entries)} entries (at most {limit})",
                )
                return True
        return False

    def too_soon(self, payload: dict[str, Any]) -> bool:
        node = str(payload.get("node", ""))
        incarnation = str(payload.get("incarnation", ""))
        now = time.monotonic()
        spacing = settings.TRAINYARD_HEARTBEAT_MIN_SPACING_SECONDS
        with self._lock:
            last = self._last.get(node)
            if last is not None and last[0] == incarnation and now - last[1] < spacing:
                soon = True
            else:
                self._last[node] = (incarnation, now)
                soon = False
        if soon:
            self._refuse(node, f"more than one heartbeat in {spacing:g} s")
        return soon

    def _refuse(self, node: str, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            count, logged = self._refused.get(node, (0, -LOG_EVERY_SECONDS))
            count += 1
            if now - logged < LOG_EVERY_SECONDS:
                self._refused[node] = (count, logged)
                return
            self._refused[node] = (0, now)
        log.warning(
            "refused %d heartbeat(s) of node %r in the last minute; the latest because %s",
            count, node, why,
        )  # fmt: skip


_gate = _Gate()


def too_large(payload: dict[str, Any]) -> bool:
    return _gate.too_large(payload)


def too_soon(payload: dict[str, Any]) -> bool:
    return _gate.too_soon(payload)


def forget() -> None:
    """Start counting afresh (tests: each begins with no heartbeat seen)."""
    global _gate
    _gate = _Gate()
