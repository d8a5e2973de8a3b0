"""Placing waiting jobs on the nodes: higher priority first, then first come first served,
with backfill, and preemption for the classes that may preempt.

`schedule()` runs in the console worker (the `schedule` task, and every reconciliation pass),
never on a user's request: it takes the node rows' locks (on SQLite, the database's one write
lock) for as long as placement takes, and a submission should not wait for that.
"""

import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import NamedTuple, Protocol

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from jobs.access import sees_jobs_of
from jobs.models import Job, JobAttempt, Node, Replica
from jobs.services.lifecycle import (
    dispatch,
    elastic,
    schedule_requests,
    time_limits,
    transitions,
)
from jobs.services.placement import (
    Demand,
    Holding,
    Room,
    gang_never_fits,
    never_fits,
    place,
    place_elastic,
    smallest,
)
from jobs.services.plain_rows import aware_dates, plain_rows
from jobs.services.scheduler import borrowing, evictions, queue, waitlist
from jobs.services.scheduler.backfill import Backfill, Reservation
from jobs.services.scheduler.pass_memo import PassMemo
from jobs.services.scheduler.preempt_pass import PreemptionPass
from jobs.services.scheduler.reclaim import Reclaimer
from jobs.services.scheduler.waitlist import WaitingJob
from jobs.services.scheduler.why_waiting import NodeView, jobs_in_words, shortfall
from jobs.services.totals import RoleRequest
from jobs.time_limit_text import in_words

log = logging.getLogger(__name__)


class NodeRow(NamedTuple):
    """A node as a scheduling pass sees it: plain values, its status worked out once."""

    pk: int
    name: str
    cpu: int
    gpus: int
    memory_gb: int
    status: str


def locked_nodes() -> list[NodeRow]:
    """Every node, its row locked until the transaction ends (SQLite: the whole database), read
    as plain values: a thousand model instances were a tenth of a pass (issue 24). The running
    lists and labels, JSON decoded for nothing, are not read."""
    query = (
        Node.objects.select_for_update()
        .order_by("name")
        .values_list(
            "id", "name", "cpu", "gpus", "memory_gb", "state", "last_heartbeat", "protocol",
            "disk_full", "isolation", "limits",
        )
    )  # fmt: skip
    aware = aware_dates(query.db)
    now = timezone.now()
    rows = []
    for (
        pk,
        name,
        cpu,
        gpus,
        memory_gb,
        state,
        heard,
        protocol,
        disk_full,
        isolation,
        limits,
    ) in plain_rows(query):
        heard_at = aware(heard) if heard is not None else None
        status = Node.status_of(state, heard_at, protocol, disk_full, isolation, now, limits=limits)
        rows.append(NodeRow(pk, name, cpu, gpus, memory_gb, status))
    return rows


class _Named(Protocol):
    @property
    def name(self) -> str: ...


def holdings(nodes: Sequence[_Named]) -> list[Holding]:
    """What each active job holds on each of these nodes (per replica, summed per job)."""
    return holdings_and_owners(nodes)[0]


def holdings_and_owners(nodes: Sequence[_Named]) -> tuple[list[Holding], dict[int, int]]:
    """holdings(), and the owner of every job that holds something, by job id: a pass's
    ledger counts them by group and its reasons name them, and the owners read here, beside
    what they hold, cost less than a query of a thousand ids after it."""
    per: dict[tuple[int, str], Holding] = {}
    owners: dict[int, int] = {}
    names = {n.name for n in nodes}
    # Plain values, not model instances: at 1,000 nodes a pass read 10,000 replicas with
    # their nodes and packages as objects (issue 24). The nodes are picked here, not by a
    # query's IN list of a thousand ids, whose parameters cost more to prepare than to run.
    # Unordered: nothing here needs an order, and the model's (by job id, then id) would have
    # the database sort what it reads off the replicas' state index. Until migration 0029 it
    # was the job's own order, which had SQLite walk every job of the history by date.
    held = (
        Replica.objects.filter(
            state__in=Replica.HOLDING_STATES, node__isnull=False, package__isnull=False
        )
        .order_by()
        .values_list(  # the platform's own roles hold nothing
            "job_id", "node__name", "package__cpu", "package__gpus", "package__memory_gb",
            "job__owner_id",
        )
    )  # fmt: skip
    for job_id, node, cpu, gpus, memory_gb, owner_id in plain_rows(held):
        owners[job_id] = owner_id
        if node not in names:
            continue
        old = per.get((job_id, node), Holding(job_id, node, 0, 0, 0))
        per[(job_id, node)] = Holding(
            job_id, node, old.cpu + cpu, old.gpus + gpus, old.memory_gb + memory_gb
        )
    return list(per.values()), owners


def free_rooms(nodes: Sequence[NodeRow | Node], held: list[Holding]) -> list[Room]:
    rooms = {n.name: Room(n.name, n.cpu, n.gpus, n.memory_gb) for n in nodes}
    for h in held:
        if h.node in rooms:
            rooms[h.node].take(Demand(("held", h.job_id), h.cpu, h.gpus, h.memory_gb))
    return list(rooms.values())


def demands_of(replicas: list[Replica], alone: bool = False) -> list[Demand]:
    """What each charged replica needs (`alone`: one instance per node); the platform's own
    roles need nothing."""
    return [
        Demand.of((r.role, r.index), r.package, alone) for r in replicas if r.package is not None
    ]


def schedule() -> list[int]:
    """Place waiting jobs in the queue's order; returns the ids dispatched.

    A job that does not fit and whose priority class may preempt evicts the running jobs
    jobs.services.scheduler.preemption chooses, and the room they free is reserved for it until they
    have stopped and it starts (jobs.services.scheduler.preempt_pass). A job that does not fit now
    does not hold back smaller jobs behind it that do (backfill). When the running jobs' time limits
    say when the first such job can start, that start is reserved and a later job may start
    first only if that cannot delay it (EASY backfill, jobs.services.scheduler.backfill). When they
    do not, the grace rule holds: once that job has waited longer than
    TRAINYARD_BACKFILL_GRACE_SECONDS the queue is strictly first come, first served until it
    starts, so a large job is never starved.
    """
    schedule_requests.answered()
    if (
        not Replica.objects.filter(
            state=Replica.State.PENDING, job__state=Job.State.QUEUED, job__slurm_pool__isnull=True
        ).exists()
        and not elastic.may_grow()
    ):
        return []  # nothing waits, nothing may grow: no need for the write lock
    with transaction.atomic():
        # Locking the node rows makes schedulers take turns. Waiting jobs are not locked as
        # they are read (ten thousand row locks a pass): one is locked, and read again, only
        # when it is placed.
        nodes = locked_nodes()
        with _cyclic_gc_paused():
            return SchedulingPass(nodes).run()


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cycle collector paused while the pass runs, once it holds the lock (so never
    while it waits for it). A pass at 10,000 waiting jobs makes some 40,000 short-lived tuples
    and rows, none in a cycle: they set off ~50 collections a pass, and every other pass one
    of the whole heap, 7-45 ms of a ~200 ms pass in a console worker's heap (issue 24).
    Reference counting frees them as before; cycles wait for the next collection."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


# Waiting jobs read and judged at a time; a pass always judges the first this many (Slurm's
# default_queue_depth is 100).
JUDGED_AT_ONCE = 200


class SchedulingPass:
    """One pass over the waiting jobs, inside the transaction that holds the node locks."""

    def __init__(self, nodes: list[NodeRow]) -> None:
        self.now = timezone.now()
        # A node that is not ready may have a reason to give (read whole: there are few).
        notes = {
            n.name: n.status_reason
            for n in Node.objects.filter(
                pk__in=[row.pk for row in nodes if row.status != Node.State.READY]
            )
        }
        self.views = [
            NodeView(n.name, n.cpu, n.gpus, n.memory_gb, n.status, notes.get(n.name, ""))
            for n in nodes
        ]
        self.usable = [n for n in nodes if n.status == Node.State.READY]
        self.held, held_owners = holdings_and_owners(nodes)
        self.rooms = free_rooms(self.usable, self.held)
        self.grace = timedelta(seconds=settings.TRAINYARD_BACKFILL_GRACE_SECONDS)
        self.easy = Backfill(
            self.now, self.held, time_limits.expected_ends(self.now), time_limits.stop_grace()
        )
        self.blocker: WaitingJob | None = None
        self._head_queued: tuple[int, datetime] | None = None  # _queued_since's, for the blocker
        self.preemption = PreemptionPass(self.held, self.now)
        # Fair share with borrowing: each group's share and use, and reclaim (read lazily).
        self.ledger = borrowing.Ledger.read(
            ((h.job_id, h.cpu, h.gpus, h.memory_gb) for h in self.held), held_owners
        )
        self.reclaimer = Reclaimer(self.held, self.now)
        self.reserved = queue.reserved_lenders()
        # By group: the first job of it that waits, in this pass, for borrowed capacity to be
        # returned to it (_taking_back).
        self.reclaiming: dict[str, int] = {}
        # What this pass worked out, said again to jobs alike until something changes.
        self.memo = PassMemo()
        self.dispatched: list[int] = []
        self.head_start: tuple[int, datetime] | None = None  # the reservation of this pass
        self._users: dict[int, User] = {}
        # The owners of the jobs reasons name (running jobs whose end frees room, the head,
        # victims), read in bulk as they are first named: every waiting owner is told of the
        # same few jobs (_visible_to).
        self._owner_of: dict[int, int | None] = dict(held_owners)

    def run(self) -> list[int]:
        new_reasons: dict[int, str] = {}
        order = waitlist.queued(self.reserved)
        # The owners whose jobs' reasons name other jobs (_visible_to), in one query.
        self._users = User.objects.in_bulk({q.owner_id for q in order})
        judged = 0
        while judged < len(order):
            if judged and not self._a_core_is_free():
                break
            self._judge(order[judged : judged + JUDGED_AT_ONCE], new_reasons, far_back=judged > 0)
            judged += JUDGED_AT_ONCE
        if judged < len(order):
            # Nothing behind can start (every instance needs a core) and nothing behind
            # changes what is ahead: as Slurm's default_queue_depth, the rest of a full
            # cluster's queue is not judged one by one (at 10,000 waiting jobs that is most
            # of a pass), but for the jobs room is coming to, which must claim it.
            rest = order[judged:]
            own = self._own_room_coming_ids()
            self._judge([q for q in rest if q.pk in own], new_reasons, far_back=True)
            for q in rest:
                if q.pk not in own and not q.told_far_back:
                    new_reasons[q.pk] = waitlist.FAR_BACK
        transitions.set_waiting_reasons(new_reasons)
        head, start = self.head_start or (None, None)
        transitions.set_estimated_start(head, start)
        if self.blocker is None and not self._others_wait(order):
            # Room nobody waits for: an elastic job below its largest size may take it.
            elastic.grow_into(self.rooms)
        return self.dispatched

    def _others_wait(self, order: list[waitlist.Queued]) -> bool:
        """Whether a job the pass judged still waits (it was not placed)."""
        placed = set(self.dispatched)
        return any(q.pk not in placed for q in order)

    def _judge(
        self, jobs: list[waitlist.Queued], new_reasons: dict[int, str], far_back: bool
    ) -> None:
        """Judge these jobs; those `far_back` in the queue that only wait for room are told
        FAR_BACK, as those past the cut are (their reason would otherwise change whenever a
        core frees or fills, and with it 10,000 jobs' state events)."""
        for start in range(0, len(jobs), JUDGED_AT_ONCE):
            for job in waitlist.read([q.pk for q in jobs[start : start + JUDGED_AT_ONCE]]):
                reason = self.consider(job)
                if far_back and reason in self.memo.waits_for_room:
                    reason = waitlist.FAR_BACK
                if reason is not None and reason != job.reason:
                    new_reasons[job.pk] = reason

    def _a_core_is_free(self) -> bool:
        return any(room.cpu > 0 for room in self.rooms)

    def _own_room_coming_ids(self) -> set[int]:
        """The waiting jobs room was set aside for by an earlier pass (_has_own_room_coming)."""
        own = set(self.reserved) | set(self.preemption.stopping())
        if self.ledger.shares:
            own |= set(self.reclaimer.stopping())
        return own

    def consider(self, job: WaitingJob) -> str | None:
        """Place the job, or say why it waits (None: placed, or gone from the queue)."""
        if self._has_own_room_coming(job):
            return self.decide(job)  # its own, never another's
        return self.memo.fate(job.alike, lambda: self.decide(job))

    def _has_own_room_coming(self, job: WaitingJob) -> bool:
        """Whether room was set aside for this job itself, by an earlier pass: a lender's that
        borrowed jobs were stopped for, or a preemptor's whose victims are stopping."""
        if job.pk in self.reserved:
            return True
        if self.preemption.may_preempt(
            job.priority_class_id
        ) and self.preemption.has_victims_stopping(job.pk):
            return True
        return bool(self.ledger.shares) and job.pk in self.reclaimer.stopping()

    def decide(self, job: WaitingJob) -> str | None:
        """Judge the job through the gates in order: the first that decides gives its reason
        (None: it was placed)."""
        demands = job.demands
        need = borrowing.need_of(
            sum(d.cpu for d in demands),
            sum(d.gpus for d in demands),
            sum(d.memory_gb for d in demands),
        )
        verdict = self.ledger.judge(job.owner_id, need)
        why = self._group_limit(job, verdict)
        if why is not None:
            return why
        # A restarted job may stay away from the nodes its earlier attempts failed on.
        allowed = (
            [room for room in self.rooms if room.node not in job.excluded_nodes]
            if job.excluded_nodes
            else self.rooms
        )
        why = self._behind_the_head(job, verdict, allowed, need)
        if why is not None:
            return why
        assignment = self._fit(job, allowed)
        if assignment is not None:
            assignment, why = self._backfill(job, allowed, assignment)
            if assignment is not None and job.extra:
                need = self._need_of(job, assignment)
            if why is not None:
                return why
        if assignment is None:
            why = self._preempt(job, allowed)
            if why is None and verdict.lender is not None:
                why = self._reclaim(job, allowed, need, verdict.lender)
            return why if why is not None else self._explain(job, allowed)
        return self.start_placed(job, assignment, need, verdict.borrowing)

    @staticmethod
    def _need_of(job: WaitingJob, assignment: dict[tuple[str, int], str]) -> dict[str, int]:
        """What an elastic job placed with `assignment` takes: its minimum and what it added."""
        placed = [d for d in [*job.demands, *job.extra] if d.key in assignment]
        return borrowing.need_of(
            sum(d.cpu for d in placed),
            sum(d.gpus for d in placed),
            sum(d.memory_gb for d in placed),
        )

    def _group_limit(self, job: WaitingJob, verdict: borrowing.Verdict) -> str | None:
        """Its group is at its borrowing limit (room on the nodes would not help, so it holds
        no one back), or its group waits for what it lent to be taken back."""
        if verdict.wait is not None:
            return verdict.wait
        if verdict.borrowing and self.reclaiming:
            return self._taking_back(job.owner_id)
        return None

    def _behind_the_head(
        self, job: WaitingJob, verdict: borrowing.Verdict, allowed: list[Room], need: dict[str, int]
    ) -> str | None:
        """Once the head of the queue (with no reserved start) has waited past its grace,
        nothing passes it to take room; but a job within its group's nominal share still takes
        back what other groups borrowed of it: that room was never free (else a group's own
        big job beyond its share would keep it below its share while others borrow)."""
        blocker = self.blocker
        if blocker is None or self.easy.reservation is not None:
            return None
        if self.now - self._queued_since(blocker) <= self.grace:
            return None
        if verdict.lender is not None:
            why = self._reclaim(job, allowed, need, verdict.lender)
            if why is not None:
                return why
        key: tuple[object, ...] = ("behind", blocker.pk, job.owner_id)
        if key not in self.memo.reasons:
            behind = jobs_in_words([blocker.pk], self._visible_to(job.owner_id))
            self.memo.reasons[key] = (
                f"waiting behind {behind}, first in the queue, which has waited for "
                f"room longer than {in_words(int(self.grace.total_seconds()))}: "
                "nothing passes it until it starts"
            )
            self.memo.waits_for_room.add(self.memo.reasons[key])
        return self.memo.reasons[key]

    @staticmethod
    def _unplaced_key(job: WaitingJob) -> tuple[object, ...]:
        return ("unplaced", job.shape, job.excluded_nodes, job.owner_id)

    def _fit(self, job: WaitingJob, allowed: list[Room]) -> dict[tuple[str, int], str] | None:
        """Where its instances go now, if they all fit (a shape found not to fit in this state
        of the pass is not tried again)."""
        room_key = (job.shape, job.excluded_nodes)
        if self._unplaced_key(job) in self.memo.reasons or room_key in self.memo.no_room:
            return None
        if job.min_size:
            assignment = place_elastic(job.demands, job.extra, allowed, job.kept)
        else:
            assignment = place(job.demands, allowed)
        if assignment is None:
            self.memo.no_room.add(room_key)
        return assignment

    def _backfill(
        self, job: WaitingJob, allowed: list[Room], assignment: dict[tuple[str, int], str]
    ) -> tuple[dict[tuple[str, int], str] | None, str | None]:
        """With a start reserved for the head, a job that fits may start now only if that
        cannot delay the head (EASY backfill): (where it goes, None), or (None, why not)."""
        if self.easy.reservation is None:
            return assignment, None
        if job.extra:
            # An elastic job is held to what it takes for sure: its smallest size.
            assignment = {d.key: assignment[d.key] for d in job.demands}
        limit = None if job.time_limit is None else timedelta(seconds=job.time_limit)
        held_back = ("held back", job.shape, job.excluded_nodes, limit, job.owner_id)
        admitted = None
        if held_back not in self.memo.reasons:
            admitted = self.easy.admits(job.demands, allowed, assignment, limit)
        if held_back in self.memo.reasons or admitted is None:
            self.memo.reasons.setdefault(held_back, self._held_back(self.easy.reservation, job))
            return None, self.memo.reasons[held_back]
        return admitted, None

    def _preempt(self, job: WaitingJob, allowed: list[Room]) -> str | None:
        """A job of a class that may preempt evicts what it needs, and the room is kept for
        it; None when it may not or finds no victims."""
        if not self.preemption.may_preempt(job.priority_class_id):
            return None
        # Jobs alike find no victims alike, until the rooms change (as `reasons`); whose they
        # are does not matter.
        no_victims = (
            "no victims", job.shape, job.excluded_nodes, job.priority, job.preempted_by
        )  # fmt: skip
        plan = None
        if no_victims not in self.memo.reasons or self.preemption.has_victims_stopping(job.pk):
            plan = self.preemption.plan(self._model(job), job.demands, allowed)
        # A victim that ended since the pass read it fails the plan: the next pass looks again.
        if plan is not None and evictions.carry_out(plan.evictions):
            why = self.preemption.claim(
                job.pk, plan, job.demands, allowed, self._visible_to(job.owner_id)
            )
            self.memo.changed()  # room is reserved for this job
            self.blocker = self.blocker or job
            return why
        self.memo.reasons[no_victims] = ""
        return None

    def _explain(self, job: WaitingJob, allowed: list[Room]) -> str:
        """Why it waits; the first job that waits for room becomes the head, for which
        backfill reserves a start when the running jobs' time limits say when it can have one."""
        key = self._unplaced_key(job)
        if key not in self.memo.reasons:
            # Worked out once per shape, put in words once per owner.
            short_key = (job.shape, job.excluded_nodes)
            if short_key not in self.memo.shortfalls:
                self.memo.shortfalls[short_key] = shortfall(
                    job.demands, allowed, self.views, self.held
                )
            why = self.memo.shortfalls[short_key].in_words(self._visible_to(job.owner_id))
            if job.excluded_nodes:
                why += f" ({', '.join(job.excluded_nodes)} excluded after failures)"
            if job.min_size:
                why += (
                    f" (elastic: it starts with at least {job.min_size} instances, its minimum, "
                    f"and takes up to {job.min_size + len(job.extra)} where they fit)"
                )
            self.memo.reasons[key] = why
        reason = self.memo.reasons[key]
        if self.blocker is not None:
            self.memo.waits_for_room.add(reason)
            return reason
        self.blocker = job
        self.memo.changed(rooms=False)  # jobs behind it are judged against it from now on
        reservation = self.easy.reserve(job.pk, job.demands, allowed)
        if reservation is not None:
            reason = f"{reason}; {reservation.in_words(self.now)}"
            self.head_start = (job.pk, reservation.start)
        return reason

    def _queued_since(self, job: WaitingJob) -> datetime:
        """When the job's current attempt joined the queue (read once per pass, for the head
        only): a restarted or preempted job waits from its return, not its submission."""
        if self._head_queued is None or self._head_queued[0] != job.pk:
            since = (
                JobAttempt.objects.filter(job_id=job.pk)
                .order_by("-number")
                .values_list("queued", flat=True)
                .first()
            )
            self._head_queued = (job.pk, since or job.created)
        return self._head_queued[1]

    def _reclaim(
        self, job: WaitingJob, allowed: list[Room], need: dict[str, int], lender: str
    ) -> str | None:
        """Stop borrowed jobs of other groups to make room for this job of group `lender`
        (within its nominal share), and reserve that room; its reason, or None when reclaim
        cannot help (or it fits already)."""
        plan = self.reclaimer.plan(
            self._model(job), job.demands, allowed, lender, self.ledger.outside(lender)
        )
        if plan is None or not evictions.carry_out(plan.evictions):
            return None  # cannot help, or a victim ended meanwhile: the next pass looks again
        why = self.reclaimer.claim(
            job.pk, plan, job.demands, allowed, lender, self._visible_to(job.owner_id)
        )
        self.memo.changed()  # room is reserved for this job
        self.ledger.take(job.owner_id, need)  # its group's share counts it already
        self.blocker = self.blocker or job
        self.reclaiming.setdefault(lender, job.pk)
        return why

    def _taking_back(self, owner_id: int) -> str | None:
        """Why a job that would borrow waits while a job of its own group, ahead of it, takes
        the group's share back: the room it would borrow now is room that job may need once
        its victims are gone (and, run beyond the share, it would push that job beyond the
        share too, where it may reclaim nothing)."""
        for share in self.ledger.shares_of(owner_id):
            ahead = self.reclaiming.get(share.group)
            if ahead is not None:
                return (
                    f"waiting: {jobs_in_words([ahead], self._visible_to(owner_id))} of group "
                    f"{share.group} is taking the group's share back first (this job would "
                    "run on borrowed capacity)"
                )
        return None

    def start_placed(
        self, job: WaitingJob, assignment: dict[tuple[str, int], str], need: dict[str, int],
        borrowed: bool,
    ) -> str | None:  # fmt: skip
        """Write the placement `assignment` (placement.place chose it) for the job, locked and read
        again, and dispatch its instances; None."""
        model = Job.objects.select_for_update().filter(pk=job.pk, state=Job.State.QUEUED).first()
        replicas = (
            list(
                model.replicas.filter(state=Replica.State.PENDING)
                .select_related("package")
                .order_by("id")
            )
            if model is not None
            else []
        )
        alone = job.one_instance_per_node
        if model is None or sorted(demands_of(replicas, alone), key=_by_key) != sorted(
            [*job.demands, *job.extra], key=_by_key
        ):
            return None  # it left the queue (or was restarted) since the pass read it
        self.memo.changed()  # the rooms change now
        if job.extra:
            # The instances an elastic job goes without this time are not part of its attempt.
            left_out = [r for r in replicas if r.package is not None and _slot(r) not in assignment]
            Replica.objects.filter(pk__in=[r.pk for r in left_out]).delete()
            replicas = [r for r in replicas if r not in left_out]
        placed_demands = [d for d in [*job.demands, *job.extra] if d.key in assignment]
        node_ids = {n.name: n.pk for n in self.usable}
        by_room = {room.node: room for room in self.rooms}
        for demand in placed_demands:
            by_room[assignment[demand.key]].take(demand)  # keep `rooms` true for the rest
            self.held.append(
                Holding(job.pk, assignment[demand.key], demand.cpu, demand.gpus, demand.memory_gb)
            )
        for replica in replicas:
            # The scheduler goes where server-0 goes: it only coordinates.
            key = ("server", 0) if replica.package is None else (replica.role, replica.index)
            replica.node_id = node_ids[assignment[key]]
        transitions.place_replicas(replicas, sent=timezone.now())
        elastic.placed(model, [assignment[d.key] for d in placed_demands])
        self.ledger.take(job.owner_id, need)
        transitions.mark_borrowed(model, borrowed)
        if job.pk in self.reserved:
            transitions.end_reservation(job.pk)
        placed = sorted(set(assignment.values()))
        on_borrowed = " on borrowed capacity" if borrowed else ""
        transitions.set_job_reason(model, f"starting on {', '.join(placed)}{on_borrowed}")
        specs = dispatch.build_specs(Job.objects.get(pk=job.pk))
        job_id = job.pk
        transaction.on_commit(
            lambda j=job_id, s=specs: dispatch.send_starts(j, s),  # type: ignore[misc]
            robust=True,
        )
        self.dispatched.append(job_id)
        return None

    def _held_back(self, reservation: Reservation, job: WaitingJob) -> str:
        """Why a job that fits now waits: it would delay the head's reserved start."""
        head = jobs_in_words([reservation.job_id], self._visible_to(job.owner_id))
        return (
            f"waiting so as not to delay {head}, {reservation.in_words(self.now)} (a job whose "
            "time limit ends it before then may start now)"
        )

    def _model(self, job: WaitingJob) -> Job:
        """The job whole, for preemption and reclaim (they name its owner and class)."""
        return Job.objects.select_related("owner").get(pk=job.pk)

    def _visible_to(self, owner_id: int) -> Callable[[list[int]], set[int]]:
        """Which of some job ids the job's owner may see: a reason names no one else's job."""
        if owner_id not in self._users:
            self._users[owner_id] = User.objects.get(pk=owner_id)
        owner = self._users[owner_id]

        def pick(job_ids: list[int]) -> set[int]:
            owners = self._owners(job_ids)
            return {j for j in job_ids if (o := owners[j]) is not None and sees_jobs_of(owner, o)}

        return pick

    def _owners(self, job_ids: list[int]) -> dict[int, int | None]:
        """The owners of these jobs (None: gone from the database), those not known yet read
        in one query."""
        unknown = [j for j in job_ids if j not in self._owner_of]
        if unknown:
            self._owner_of.update(dict.fromkeys(unknown))
            self._owner_of.update(Job.objects.filter(pk__in=unknown).values_list("pk", "owner_id"))
        return self._owner_of


def _by_key(demand: Demand) -> tuple[str, int]:
    return demand.key


def _slot(replica: Replica) -> tuple[str, int]:
    return (replica.role, replica.index)


def why_never_placeable(
    roles: list[RoleRequest], one_instance_per_node: bool = False
) -> dict[str, str]:
    """Why the request could not start even on empty nodes, by field; {} when it could.

    Judged against the nodes that are not draining; with no node known yet nothing is judged
    (agents may still be starting), and the job waits instead.
    """
    # Plain values: a submission read 1,000 node rows whole, with what each runs (issue 24).
    capacities = [
        Room(*row)
        for row in Node.objects.exclude(state=Node.State.DRAINING).values_list(
            "name", "cpu", "gpus", "memory_gb"
        )
    ]
    if not capacities:
        return {}
    total = sum(c.cpu for c in capacities), sum(c.gpus for c in capacities)
    problems: dict[str, str] = {}
    for role in roles:
        p = role.package
        if never_fits([Demand.of((role.role, 0), p)], capacities):
            problems[f"roles.{role.role}.package"] = (
                f"No node can hold {p.name!r} ({p.summary}), so it could never start."
            )
    if problems:
        return problems
    alone = one_instance_per_node
    # An elastic role starts with its minimum: the most is only where room is.
    demands = [
        Demand.of((r.role, i), r.package, alone)
        for r in roles
        for i in range(r.instances if r.min_instances is None else r.min_instances)
    ]
    if gang_never_fits(demands, capacities):
        holders = sum(1 for c in capacities if c.fits(smallest(demands)))
        if alone and holders < len(demands):
            nodes = (
                f"there are only {holders} nodes"
                if holders == len(capacities)
                else f"only {holders} of the {len(capacities)} nodes could hold one"
            )
            problems["roles"] = (
                f"The {len(demands)} instances go one per node, and {nodes}. Use fewer "
                "instances, or let instances share a node."
            )
            return problems
        problems["roles"] = (
            f"The {len(demands)} instances could never all run at once: the {len(capacities)} "
            f"nodes hold {total[0]} CPU cores and {total[1]} GPUs in all. Use fewer instances."
        )
    return problems
