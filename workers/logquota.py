"""A replica's log budget, kept where its lines are read (the agent), so that lines over it never
reach memory queues, the disk spool or Redis.

Three limits travel in the replica's spec (`ReplicaSpec.log_limits`, set by the console from the
job, which a user may set lower than its image's ceilings but not above them):

- lines per second, a token bucket with a few seconds of burst: a trainer that prints in bursts
  (an epoch summary, a traceback) keeps every line; one that prints in a loop does not;
- bytes of log in all (this instance's share of the job's total): once spent, every later line
  is dropped;
- metric points per second (a metric flood is a log flood), a token bucket like the first.

Nothing is dropped silently: every drop is counted, and the count comes back as a `[trainyard]`
line in the instance's own stderr — the first at once, then at most every MARKER_SECONDS while
dropping goes on, and the rest when the instance ends — whose stream entry carries the count, so
the console adds them up for the job page and the API.

Pure bookkeeping: the caller passes the time, so the tests need no clock.
"""

import threading
from dataclasses import dataclass

# Seconds of the rate a bucket holds when full: the burst a quiet trainer may print at once.
BURST_SECONDS = 5.0
# While lines are being dropped, one marker line at most this often (each says how many).
MARKER_SECONDS = 5.0
# What a line costs beyond its characters: the newline that separates it from the next.
LINE_OVERHEAD = 1


@dataclass(frozen=True, slots=True)
class LogLimits:
    """Limits of one instance. 0 means no limit (a console older than log limits sends none)."""

    lines_per_second: int = 0
    max_bytes: int = 0  # this instance's share of the job's total
    job_max_bytes: int = 0  # the job's total, for the marker's wording
    metric_points_per_second: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, int]) -> "LogLimits":
        known = {k: max(0, int(v)) for k, v in data.items() if k in cls.__slots__}
        return cls(**known)

    def to_dict(self) -> dict[str, int]:
        return {
            "lines_per_second": self.lines_per_second,
            "max_bytes": self.max_bytes,
            "job_max_bytes": self.job_max_bytes,
            "metric_points_per_second": self.metric_points_per_second,
        }


@dataclass(frozen=True, slots=True)
class Marker:
    """A `[trainyard]` line to ship in the instance's stderr, and the drops it accounts for."""

    text: str
    dropped_lines: int = 0
    dropped_points: int = 0


class TokenBucket:
    """A rate with a burst: `take` lets through what the tokens saved up since the last call
    allow, up to `capacity` at once. The caller passes the time."""

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.refilled = now

    def take(self, wanted: int, now: float) -> int:
        """How many of `wanted` may pass now (the first ones)."""
        self.tokens = min(self.capacity, self.tokens + (now - self.refilled) * self.rate)
        self.refilled = now
        allowed = min(wanted, int(self.tokens))
        self.tokens -= allowed
        return allowed


def _bucket(rate: int, now: float) -> TokenBucket | None:
    """A limit's bucket, with BURST_SECONDS of the rate as its burst; None for no limit (0)."""
    return TokenBucket(rate, rate * BURST_SECONDS, now) if rate else None


class LogBudget:
    """The budget of one instance: which of its lines and points may go on, and the markers
    that account for the rest. Safe to call from the instance's several pipe readers at once."""

    def __init__(self, limits: LogLimits, now: float) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._lines = _bucket(limits.lines_per_second, now)
        self._points = _bucket(limits.metric_points_per_second, now)
        self._bytes_left = limits.max_bytes if limits.max_bytes else None
        # Drops not yet told in a marker, and why; and when the last marker went out.
        self._unreported_lines = 0
        self._unreported_points = 0
        self._line_reason = ""
        self._last_marker: float | None = None
        self.dropped_lines = 0  # in all, told or not
        self.dropped_points = 0

    def admit_lines(self, lines: list[str], now: float) -> tuple[list[str], Marker | None]:
        """The lines that may go on (a prefix of `lines`), and a marker to ship after them."""
        with self._lock:
            allowed = len(lines)
            reason = ""
            if self._lines is not None:
                allowed = self._lines.take(allowed, now)
                if allowed < len(lines):
                    reason = f"over the job's log limit of {self.limits.lines_per_second:,} lines/s"
            if self._bytes_left is not None:
                allowed = self._within_bytes(lines, allowed)
                if allowed < len(lines) and not self._bytes_left:
                    reason = self._bytes_reason()
            dropped = len(lines) - allowed
            if dropped:
                self._unreported_lines += dropped
                self.dropped_lines += dropped
                self._line_reason = reason
            return lines[:allowed], self._marker_due(now, dropped > 0)

    def admit_points(self, count: int, now: float) -> tuple[int, Marker | None]:
        """How many of `count` metric points may go on (the first ones), and a marker."""
        with self._lock:
            allowed = count if self._points is None else self._points.take(count, now)
            dropped = count - allowed
            if dropped:
                self._unreported_points += dropped
                self.dropped_points += dropped
            return allowed, self._marker_due(now, dropped > 0)

    def final_marker(self) -> Marker | None:
        """The drops no marker has told yet (the instance ended)."""
        with self._lock:
            return self._marker()

    def _within_bytes(self, lines: list[str], allowed: int) -> int:
        assert self._bytes_left is not None
        if self._bytes_left <= 0:
            return 0
        for k in range(allowed):
            cost = len(lines[k]) + LINE_OVERHEAD
            if cost > self._bytes_left:
                # A line is kept whole or not at all; and once one did not fit, no later
                # (shorter) one goes either, so the log does not go on with holes in it.
                self._bytes_left = 0
                return k
            self._bytes_left -= cost
        return allowed

    def _bytes_reason(self) -> str:
        share = self.limits.max_bytes
        whole = self.limits.job_max_bytes
        if whole and whole != share:
            return (
                f"over this instance's share ({human_bytes(share)}) of the job's log limit "
                f"of {human_bytes(whole)}"
            )
        return f"over the job's log limit of {human_bytes(share)}"

    def _marker_due(self, now: float, dropping: bool) -> Marker | None:
        if not (self._unreported_lines or self._unreported_points):
            return None
        # The first drop is told at once; later ones gather for MARKER_SECONDS, and an episode
        # that ended (lines pass again) is told now, so the count sits beside the hole.
        if self._last_marker is not None and dropping and now - self._last_marker < MARKER_SECONDS:
            return None
        self._last_marker = now
        return self._marker()

    def _marker(self) -> Marker | None:
        parts = []
        if self._unreported_lines:
            parts.append(f"{self._unreported_lines:,} lines dropped: {self._line_reason}")
        if self._unreported_points:
            parts.append(
                f"{self._unreported_points:,} metric points dropped: over the job's limit of "
                f"{self.limits.metric_points_per_second:,} points/s"
            )
        if not parts:
            return None
        marker = Marker(
            "[trainyard] " + "; ".join(parts), self._unreported_lines, self._unreported_points
        )
        self._unreported_lines = 0
        self._unreported_points = 0
        return marker


def human_bytes(count: int) -> str:
    """1 GB, 250 MB, 12 kB: decimal units, as disks are sold and as the admin sets them."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= size:
            value = count / size
            return (
                f"{value:,.0f} {unit}"
                if value >= 10 or value == int(value)
                else f"{value:.1f} {unit}"
            )
    return f"{count} bytes"
