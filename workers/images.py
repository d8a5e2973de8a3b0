"""Container images on a node: present before an instance starts, pulled once and kept, and
the least recently used removed when the node's image cache grows past its limit.

An instance whose image the node lacks waits for one pull (several instances of one job on the
node share it), and its log says so ("pulling image X on node-2", then how long it took). A pull
that fails, or one that outlasts its time limit, ends the instance with the runtime's own words:
"image X not found on node-1: <what podman said>", never a hang.

What is removed: images this agent has used, least recently first, never one a running instance
uses and never one under `localhost/`, which no registry holds: those were built or loaded on
the host (`podman build`, `podman load`), and a site removes them itself.
"""

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from workers import containers
from workers.containers import Runtime

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 100 << 30  # the agent's --image-cache-gb
PULL_TIMEOUT_SECONDS = 30 * 60.0
# How often a long pull says it is still going, in the instance's log.
PULL_PROGRESS_SECONDS = 15.0
LOCAL_ONLY_PREFIX = "localhost/"
INSPECT_TIMEOUT_SECONDS = 60.0


class ImageMissing(RuntimeError):
    pass


class _Stopped(Exception):
    pass


class ImageCache:
    def __init__(
        self,
        runtime: Runtime,
        node: str,
        record: Path,
        limit_bytes: int,
        pull_timeout: float = PULL_TIMEOUT_SECONDS,
    ) -> None:
        self.runtime = runtime
        self.node = node
        self.limit_bytes = limit_bytes
        self.pull_timeout = pull_timeout
        # {reference: last use (epoch seconds)}: survives the agent, so that an image used
        # before a restart is still this cache's to remove. It is in the agent's own work
        # dir, where no job writes (jobs write only in the folders handed over to them).
        self._record = record
        self._lock = threading.Lock()
        self._pulls: dict[str, threading.Lock] = {}

    def _runtime(
        self, *args: str, timeout: float = INSPECT_TIMEOUT_SECONDS
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.runtime.path, *args],
            env=self.runtime.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def present(self, reference: str) -> bool:
        _, *args = containers.image_exists_argv(self.runtime.path, reference)
        return self._runtime(*args).returncode == 0

    def ensure(
        self,
        reference: str,
        note: Callable[[str], None],
        should_stop: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Make `reference` present on this node; True if it had to be pulled. Raises
        ImageMissing with the runtime's words if it cannot be; returns early (False) if
        `should_stop` turns true meanwhile."""
        with self._lock:
            pull_lock = self._pulls.setdefault(reference, threading.Lock())
        with pull_lock:  # one pull per image: the node's other instances wait for it
            try:
                if self.present(reference):
                    self._used(reference)
                    return False
                self._pull(reference, note, should_stop)
            except _Stopped:
                return False
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ImageMissing(f"image {reference} not found on {self.node}: {exc}") from None
        self._used(reference)
        return True

    def _pull(
        self, reference: str, note: Callable[[str], None], should_stop: Callable[[], bool]
    ) -> None:
        note(f"pulling image {reference} on {self.node}")
        started = time.monotonic()
        words: list[str] = []
        with subprocess.Popen(
            [self.runtime.path, "pull", "--quiet", reference]
            if self.runtime.is_podman
            else [self.runtime.path, "pull", reference],
            env=self.runtime.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        ) as pull:
            reader = threading.Thread(target=lambda: words.extend(pull.stderr or []), daemon=True)
            reader.start()
            told = started
            while pull.poll() is None:
                now = time.monotonic()
                if should_stop() or now - started > self.pull_timeout:
                    pull.kill()
                    pull.wait()
                    if should_stop():
                        raise _Stopped
                    raise ImageMissing(
                        f"image {reference} not found on {self.node}: no pull finished "
                        f"within {self.pull_timeout:.0f} s"
                    )
                if now - told >= PULL_PROGRESS_SECONDS:
                    told = now
                    note(f"still pulling image {reference} on {self.node} ({now - started:.0f} s)")
                time.sleep(0.2)
            reader.join(5)
        if pull.returncode != 0:
            said = " / ".join(w.strip() for w in words if w.strip())[-600:]
            raise ImageMissing(
                f"image {reference} not found on {self.node}: {said or f'exit {pull.returncode}'}"
            )
        note(f"pulled image {reference} on {self.node} in {time.monotonic() - started:.1f} s")

    def _read(self) -> dict[str, float]:
        try:
            doc = json.loads(self._record.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): float(v) for k, v in doc.items()} if isinstance(doc, dict) else {}

    def _write(self, doc: dict[str, float]) -> None:
        self._record.parent.mkdir(parents=True, exist_ok=True)
        partial = self._record.with_suffix(".partial")
        partial.write_text(json.dumps(doc))
        os.replace(partial, self._record)

    def _used(self, reference: str) -> None:
        with self._lock:
            self._write({**self._read(), reference: time.time()})

    def sizes(self, references: list[str]) -> dict[str, int]:
        """Each present image's size in bytes (absent ones are left out)."""
        found = {}
        for reference in references:
            done = self._runtime("image", "inspect", "--format", "{{.Size}}", reference)
            if done.returncode == 0 and done.stdout.strip().isdigit():
                found[reference] = int(done.stdout.strip())
        return found

    def prune(self, in_use: set[str]) -> list[str]:
        """Remove the least recently used images of this cache until what it holds fits its
        limit; never one in `in_use` nor a local-only one. Returns what was removed."""
        with self._lock:
            used = self._read()
        sizes = self.sizes(sorted(used))
        total = sum(sizes.values())
        removed = []
        for reference in sorted(sizes, key=lambda r: used[r]):
            if total <= self.limit_bytes:
                break
            if reference in in_use or reference.startswith(LOCAL_ONLY_PREFIX):
                continue
            if self._runtime("rmi", reference).returncode == 0:
                total -= sizes[reference]
                removed.append(reference)
                log.info("image cache: removed %s (%d MB)", reference, sizes[reference] >> 20)
        if removed:
            with self._lock:
                doc = self._read()
                for reference in removed:
                    doc.pop(reference, None)
                self._write(doc)
        return removed
