"""The ASGI lifespan protocol of the web process: uvicorn says when the process has started
and when it stops. At the start the collector is settled (console/gcpolicy.py); nothing is
held that a stop would have to release."""

from typing import Any

from console import gcpolicy


async def lifespan(scope: dict[str, Any], receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            gcpolicy.settle()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
