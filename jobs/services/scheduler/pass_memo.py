"""What one scheduling pass has worked out and may say again while the state it was worked out
in holds (issue 24: 10,000 waiting jobs are mostly a few shapes of a few owners, and judging
each alone was most of a pass).

Two lifetimes. What depends on the free rooms (why a shape finds no room, whether it fits at
all, the reasons put in words from those) holds until something is placed or reserved. What a
job was told as a whole (its fate, given to the next job alike without judging it again) holds
only until anything changes: the rooms, the ledger of borrowed capacity, or the head of the
queue that later jobs are judged against.
"""

from collections.abc import Callable, Hashable

from jobs.services.scheduler.why_waiting import Shortfall


class PassMemo:
    def __init__(self) -> None:
        # Reasons by what they depend on (a shape, its excluded nodes, its owner, ...): jobs of
        # one owner with the same demands and exclusions wait for the same reason.
        self.reasons: dict[tuple[object, ...], str] = {}
        # Why jobs of one shape find no room, whoever owns them, and the shapes that find none.
        self.shortfalls: dict[tuple[object, ...], Shortfall] = {}
        self.no_room: set[tuple[object, ...]] = set()
        # The reasons given that say only that a job waits for room (none fits it now, or it
        # waits behind the head), not the head's own: far back in the queue they become
        # waitlist.FAR_BACK.
        self.waits_for_room: set[str] = set()
        self._fates: dict[Hashable, str] = {}
        self._changes = 0

    def fate(self, alike: Hashable, judge: Callable[[], str | None]) -> str | None:
        """What a job alike was told since the last change, or judge() this one; its reason is
        kept for the next job alike only if judging it changed nothing (None: it was placed)."""
        if alike in self._fates:
            return self._fates[alike]
        before = self._changes
        reason = judge()
        if reason is not None and self._changes == before:
            self._fates[alike] = reason
        return reason

    def changed(self, rooms: bool = True) -> None:
        """Something changed: no fate holds any more, and if the rooms changed (`rooms`), no
        reason that depends on them."""
        self._changes += 1
        self._fates.clear()
        if rooms:
            self.reasons.clear()
            self.shortfalls.clear()
            self.no_room.clear()
