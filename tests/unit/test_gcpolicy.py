"""The web process settles its garbage collector once uvicorn says it has started (the ASGI
lifespan protocol): what starting built is frozen, and collections come less often."""

import gc
from collections.abc import Iterator

import pytest
from asgiref.testing import ApplicationCommunicator

from console import gcpolicy
from console.asgi import application


@pytest.fixture
def collector_restored() -> Iterator[None]:
    """The test process's collector as it was: the settling is for a server's process."""
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("collector_restored")
async def test_the_web_process_settles_the_collector_once_started() -> None:
    gc.unfreeze()
    server = ApplicationCommunicator(application, {"type": "lifespan", "asgi": {"version": "3.0"}})
    await server.send_input({"type": "lifespan.startup"})
    assert await server.receive_output(timeout=5) == {"type": "lifespan.startup.complete"}
    assert gc.get_threshold() == gcpolicy.THRESHOLDS
    assert gc.get_freeze_count() > 0  # the modules, Django's models and URL patterns among them
    await server.send_input({"type": "lifespan.shutdown"})
    assert await server.receive_output(timeout=5) == {"type": "lifespan.shutdown.complete"}
    await server.wait(timeout=5)  # and it ends
