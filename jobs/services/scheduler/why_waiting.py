"""Why a queued job waits, in words a user can act on.

"waiting: needs a node with 2 GPUs free; node-2 frees 2 GPUs when job 41 ends"

The reader is the waiting job's owner: a job of theirs is named by its id, anyone else's only
counted ("when a job of another user ends"), as everywhere the owner reads (issue 22).
"""

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from jobs.services.placement import Demand, Holding, Room, describe, first_unplaceable


@dataclass(frozen=True)
class NodeView:
    name: str
    cpu: int
    gpus: int
    memory_gb: int
    status: str  # ready, draining, lost, ... (Node.status)
    # Why it takes no new work, where the status alone does not say (Node.status_reason):
    # "node-2: no space left on /var/lib/trainyard-agent"
    note: str = ""

    def described(self) -> str:
        return self.note or f"{self.name} {self.status}"


@dataclass(frozen=True)
class Shortfall:
    """Why a job cannot start, before it is put in words for a reader: the same for every job
    of one shape, whoever owns it (a scheduling pass works it out once per shape; issue 25)."""

    text: str  # the whole reason, or its head when a node frees room once `ending` end
    node: str = ""
    freed: str = ""
    ending: tuple[int, ...] = ()
    noted: str = ""  # nodes not taking work for a reason their agent gave

    def in_words(self, may_name: Callable[[list[int]], Collection[int]]) -> str:
        """The reason as the job's owner reads it: `may_name` picks, from some job ids, those
        the owner may see (jobs.access.visible_jobs); the others go unnamed."""
        why = self.text
        if self.ending:
            verb = "ends" if len(self.ending) == 1 else "end"
            why = (
                f"{why}; {self.node} frees {self.freed} when "
                f"{jobs_in_words(list(self.ending), may_name)} {verb}"
            )
        return f"{why} (not taking work: {self.noted})" if self.noted else why


def shortfall(
    demands: Sequence[Demand],
    rooms: Sequence[Room],
    nodes: Sequence[NodeView],
    holdings: Sequence[Holding],
) -> Shortfall:
    """Why the job whose `demands` these are cannot start, for any reader."""
    if not nodes:
        return Shortfall("waiting for a node agent to register")
    ready = [n for n in nodes if n.status == "ready"]
    if not ready:
        states = ", ".join(n.described() for n in nodes)
        return Shortfall(f"waiting: no node is ready ({states})")
    # Nodes that would be ready but for something their agent said (a full disk, an old
    # protocol): the user should hear of them, they may be why the job waits.
    noted = "; ".join(n.note for n in nodes if n.note and n.status != "ready")
    stuck = first_unplaceable(demands, rooms)
    if stuck is None:
        return Shortfall("waiting for its turn in the queue")
    return _no_room(stuck, ready, holdings, noted)


def _no_room(
    stuck: tuple[Demand, list[Room]],
    ready: Sequence[NodeView],
    holdings: Sequence[Holding],
    noted: str,
) -> Shortfall:
    demand, rooms_then = stuck
    need = describe(demand.cpu, demand.gpus, demand.memory_gb)
    head = f"waiting: needs a node with {need} free"
    if demand.alone:
        head += " besides the nodes its other instances take (one instance per node)"
    best: tuple[int, str, list[int], Room] | None = None
    by_name = {r.node: r for r in rooms_then}
    held_on: dict[str, list[Holding]] = {}
    for h in holdings:  # once, not once per node: a thousand nodes hold thousands of jobs
        held_on.setdefault(h.node, []).append(h)
    for node in ready:
        whole = Room(node.name, node.cpu, node.gpus, node.memory_gb)
        room = by_name.get(node.name)
        if room is None or not whole.fits(demand):
            continue
        ending = _jobs_to_end(demand, room, held_on.get(node.name, []))
        if ending and (best is None or len(ending) < best[0]):
            best = (len(ending), node.name, ending, room)
            if len(ending) == 1:
                break  # no node can need fewer: at a thousand full nodes, the first will do
    if best is None:
        return Shortfall(head, noted=noted)
    _, node_name, ending, room = best
    # Of what the job lacks there, what those jobs' end frees: all they hold of it, not only
    # the lack (a blocker of 4 cores read "frees 1 CPU core" when the job lacked one).
    ended = [h for h in held_on.get(node_name, []) if h.job_id in set(ending)]
    freed = describe(
        sum(h.cpu for h in ended) if demand.cpu > room.cpu else 0,
        sum(h.gpus for h in ended) if demand.gpus > room.gpus else 0,
        sum(h.memory_gb for h in ended) if demand.memory_gb > room.memory_gb else 0,
    )
    return Shortfall(head, node_name, freed, tuple(ending), noted)


def jobs_in_words(job_ids: list[int], may_name: Callable[[list[int]], Collection[int]]) -> str:
    """Jobs as a reason names them: "job 7 and job 9"; those the reader may not see are
    counted, never named: "job 7 and a job of another user", "2 jobs of other users"."""
    named = set(may_name(job_ids)) if job_ids else set()
    parts = [f"job {j}" for j in job_ids if j in named]
    others = sum(1 for j in job_ids if j not in named)
    if others == 1:
        parts.append("a job of another user")
    elif others > 1:
        parts.append(f"{others} jobs of other users")
    return " and ".join(parts)


def _jobs_to_end(demand: Demand, room: Room, holdings: list[Holding]) -> list[int]:
    """The fewest jobs (largest holders first) whose end makes `room` fit `demand`."""
    free = Room(room.node, room.cpu, room.gpus, room.memory_gb)
    ending: list[int] = []
    for h in sorted(holdings, key=lambda h: (h.gpus, h.cpu, h.memory_gb), reverse=True):
        if free.fits(demand):
            break
        free.cpu += h.cpu
        free.gpus += h.gpus
        free.memory_gb += h.memory_gb
        ending.append(h.job_id)
    return sorted(ending) if free.fits(demand) else []
