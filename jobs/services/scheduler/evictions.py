"""The scheduling pass's one way to stop running jobs for a waiting one.

Preemption (preempt_pass) and reclaim (reclaim) only choose: each returns the running jobs it
would stop, as `Eviction`s, and the scheduling pass carries them out here before it lets the
pass that chose them reserve the room they free. So what a pass decides can be read, and
tested, apart from what it changes, and a job is stopped by the scheduler in one place.
"""

from dataclasses import dataclass

from jobs.services.lifecycle import outcomes, transitions


@dataclass(frozen=True)
class Eviction:
    """A running job to stop for the waiting job `for_job`: its attempt ends with `reason`, it
    goes back to the queue (outcomes.evict), and the job records why (`reclaim`: to return
    borrowed capacity to `for_job`'s group; else preempted by `for_job`, of a higher class)."""

    victim_id: int
    for_job: int
    reason: str
    reclaim: bool


def carry_out(evictions: list[Eviction]) -> bool:
    """Stop every victim; False when one of them no longer ran (it ended since the pass read
    it), and the waiting job is judged again by the next pass. The others stay stopped: they
    were chosen because the waiting job needs their room, and it will need it then too."""
    stopped = [e for e in evictions if _stop(e)]
    return len(stopped) == len(evictions)


def _stop(eviction: Eviction) -> bool:
    victim = outcomes.evict(eviction.victim_id, eviction.reason)
    if victim is None:
        return False
    if eviction.reclaim:
        transitions.note_reclaimed(victim, eviction.for_job)
    else:
        transitions.note_preempted(victim, victim.attempt - 1, eviction.for_job)
    return True
