"""`manage.py keep_logs`: run the log keeper (jobs.services.logarchive) until SIGTERM or Ctrl-C.

Run at least one next to the console worker; `make run` starts one.
"""

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand

from jobs.redis_client import get_redis
from jobs.services import logarchive


class Command(BaseCommand):
    help = "Copy every job's log from Redis into the database, as it is written."

    def handle(self, *args: Any, **options: Any) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        stop = threading.Event()

        def on_signal(signum: int, frame: object) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.stdout.write("log keeper: archiving job logs from Redis into the database")
        logarchive.run(get_redis(), stop)
