"""What one job printing as fast as it can costs the disk (var/) and Redis: a one-off measurement
for the log limits (README, *Log limits*), not part of `make bench`.

Starts the real stack (one node, code root bench/programs/), runs bench/programs/firehose.py for
SECONDS (default 60) under the image's default log limits, and prints how much var/ and Redis's
used_memory grew, Redis's peak used_memory and the job's stream's peak length while it ran, and
what the job kept and dropped. With --unlimited the image's limits are lifted first (the
baseline: what a job may do without them; it needs gigabytes of disk for 60 s).

    python -m bench.logquota [SECONDS] [--unlimited]
"""

import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import redis

from stack.redis_server import free_port
from stack.run import Stack

PROGRAMS = Path(__file__).resolve().parent / "programs"
LIFT_LIMITS = (
    "from jobs.models import FrameworkImage; "
    "FrameworkImage.objects.update(log_lines_per_second=10**8, log_max_mb=10**7, "
    "metric_points_per_second=10**8)"
)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def measure(seconds: float, unlimited: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-logquota-") as tmp:
        var = Path(tmp) / "var"
        stack = Stack(var_dir=var, port=free_port(), nodes=1, code_root=PROGRAMS)
        stack.prepare()
        stack.start()
        try:
            if unlimited:
                stack.manage("shell", "-c", LIFT_LIMITS)
            token = stack.manage("token", "admin").strip()
            api = httpx.Client(
                base_url=stack.url, headers={"Authorization": f"Token {token}"}, timeout=60
            )
            server = redis.Redis.from_url(stack.redis_url, decode_responses=True)
            time.sleep(5)  # let the fresh stack settle
            var_before = folder_bytes(var)
            redis_before = int(server.info("memory")["used_memory"])
            answer = api.post(
                "/api/v1/jobs",
                json={
                    "name": "firehose",
                    "image": "pytorch:2.13-cpu",
                    "program": {"script": "firehose.py", "args": [str(seconds)]},
                    "roles": {"master": {"package": "cpu-1", "instances": 1}},
                },
            )
            answer.raise_for_status()
            job_id = answer.json()["id"]
            stream = f"trainyard:{{job:{job_id}}}:log"
            peak = {"memory": redis_before, "xlen": 0}
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.25):
                    try:
                        used = int(server.info("memory")["used_memory"])
                        length = int(server.xlen(stream))
                    except redis.RedisError:
                        continue
                    peak["memory"] = max(peak["memory"], used)
                    peak["xlen"] = max(peak["xlen"], length)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            started = time.monotonic()
            while True:
                job = api.get(f"/api/v1/jobs/{job_id}").json()
                if job["state"] in ("succeeded", "failed", "cancelled") and job["log_archived"]:
                    break
                time.sleep(1)
            done.set()
            sampler.join()
            elapsed = time.monotonic() - started
            var_after = folder_bytes(var)
            redis_after = int(server.info("memory")["used_memory"])
            cap = str(server.config_get("maxmemory")["maxmemory"])
            print(f"firehose for {seconds:.0f} s, limits {'lifted' if unlimited else 'default'}:")
            print(f"  job {job_id} {job['state']}, log archived after {elapsed:.0f} s")
            print(f"  log limits {job['log_limits']}; dropped {job['log_dropped']}")
            print(f"  var/ grew {(var_after - var_before) / 1e6:,.1f} MB")
            print(f"  Redis used_memory grew {(redis_after - redis_before) / 1e6:,.1f} MB; ")
            print(
                f"  peak used_memory while it ran {peak['memory'] / 1e6:,.1f} MB "
                f"(was {redis_before / 1e6:,.1f} MB; maxmemory {int(cap) / 1e6:,.0f} MB); "
                f"peak stream length {peak['xlen']:,} entries"
            )
        finally:
            stack.stop()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    measure(float(args[0]) if args else 60.0, "--unlimited" in sys.argv)
