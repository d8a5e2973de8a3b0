"""Which way a heartbeat goes to the console, decided in one place for the node agent
(workers/agent.py) and the simulated fleet (bench/fleet.py) alike (issue 24).

A Celery task costs the console worker about 0.8 ms of CPU before its own code runs: at 1,000
nodes every 5 s that was most of the third of a core heartbeats took. So while a console worker
drains heartbeats itself (jobs/services/heartbeat_drain.py) it keeps
contract.HEARTBEATS_DRAINED_KEY set, with a TTL of seconds that it refreshes, and an agent that
finds the flag set RPUSHes its signed heartbeat (the very payload the task would carry, as
JSON) onto contract.HEARTBEATS_KEY. An agent that finds no flag (an older console, the console
worker down or restarting, TRAINYARD_HEARTBEAT_DRAIN off), or cannot read it (the ACL an older
console wrote does not grant the key), or cannot push, sends the Celery task as before: both
paths end in the same checks and the same write.

The list cannot grow without bound: agents push only while the flag lives, and it outlives the
last console worker that refreshed it by its TTL at most; the console worker deletes it when it
stops. Heartbeats pushed but never drained (the console worker killed outright) are lost, and
so is the drain's batch in hand: a heartbeat is neither an accepted job nor a log line, and
each agent sends its next within its interval, through Celery once the flag has expired.
(An agent that ignores the flag can push what it likes, as it can LPUSH onto the console's
Celery queue: the console's size and rate limits hold on both paths, and the signature says
who pushed.)

Sans I/O: the agent reads the flag with its blocking Redis client, the fleet with an asyncio
one; each asks `route` what to do with what it read.
"""

import json
from typing import Any


def route(flag: object, payload: dict[str, Any]) -> str | None:
    """The message to RPUSH onto contract.HEARTBEATS_KEY for this signed heartbeat, given what
    GET contract.HEARTBEATS_DRAINED_KEY answered (None: no console drains); None: send the
    Celery task instead."""
    if flag is None:
        return None
    return json.dumps(payload, separators=(",", ":"))
