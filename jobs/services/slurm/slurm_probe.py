"""`slurm_pool --check`: one tiny Slurm job that tries, on a node, what every job of the pool
will need, and says exactly what failed.

Asking `sinfo` proved only that the console host reaches slurmctld. A pool whose nodes could
not reach the console's Redis then ran its first job to "succeeded" with no line in its log. The
test job runs as a job of the pool does (the pool's partition, site options and Python, on the
shared root) and checks, on the node:

- the pool's Python runs and imports Trainyard's `workers` package;
- the shared root is the same file system there: it reads a token the console wrote, and
  writes its answer beside it;
- the code root is there;
- the console's Redis answers at the pool's Redis host, with a user of its own that may only
  PING (deleted after).
"""

import json
import secrets
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import redis
from django.conf import settings

from jobs.models import Job, SlurmPool
from jobs.redis_client import get_redis
from jobs.services.slurm import slurm_batch, slurm_choices, slurm_fit, slurm_states
from jobs.services.slurm.slurm_choices import SlurmChoices
from jobs.services.slurm.slurm_client import SlurmError, SlurmTarget, run_client
from workers import credentials

# How long the test job may wait in Slurm's queue and run, at most.
PROBE_SECONDS = 120.0
POLL_SECONDS = 0.5
PROBE_USER_PREFIX = "slurmcheck-"


@dataclass(frozen=True)
class Finding:
    ok: bool
    words: str

    def __str__(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.words}"


def check_pool(pool: SlurmPool) -> list[Finding]:
    """Everything found, in order; the first failure that makes the rest unknowable is last."""
    target = slurm_batch.target_of(pool)
    found: list[Finding] = []
    for partition in slurm_choices.partitions_of(pool):
        try:
            shape = slurm_fit.read_partition(target, partition)
        except SlurmError as exc:
            return [
                *found,
                Finding(False, f"Slurm did not answer about partition {partition!r}: {exc}"),
            ]
        if not shape.nodes:
            return [
                *found,
                Finding(False, f"Slurm has no partition {partition!r}, or it has no nodes"),
            ]
        cpus = sum(n.cpus for n in shape.nodes)
        found.append(
            Finding(True, f"Slurm answers: partition {partition}, {len(shape.nodes)} nodes, "
                    f"{cpus} CPUs")
        )  # fmt: skip
    folder = target.shared_root / "checks" / secrets.token_hex(8)
    try:
        folder.mkdir(parents=True, mode=0o700)
        token = secrets.token_hex(16)
        (folder / "token").write_text(token)
    except OSError as exc:
        return [*found, Finding(False, f"the shared root cannot be written here: {exc}")]
    name = f"{PROBE_USER_PREFIX}{folder.name}"
    if not settings.REDIS_URL:
        # `make slurm` registers its pool from a shell without the console's environment.
        found.append(Finding(True, "Redis not tried: this command runs without the console's "
                             "REDIS_URL (give it that to try Redis from a node too)"))  # fmt: skip
        url = ""
    else:
        try:
            url = _grant(name, pool.redis_host)
        except redis.RedisError as exc:
            return [*found, Finding(False, f"the console's own Redis did not answer: {exc}")]
    try:
        return found + _run_test_job(pool, target, folder, token, url)
    finally:
        if url:
            try:
                get_redis().execute_command("ACL", "DELUSER", name)
            except redis.RedisError:
                pass


def _grant(name: str, host: str) -> str:
    """A Redis user that may only PING; its URL with `host` as the nodes reach Redis."""
    secret = credentials.new_secret()
    rules = ["reset", "on", f"#{credentials.password_hash(secret)}", "resetchannels", "-@all"]
    get_redis().execute_command("ACL", "SETUSER", name, *rules, "+ping")
    ours = urllib.parse.urlsplit(settings.REDIS_URL or "redis://127.0.0.1:6379/0")
    return (
        f"{ours.scheme}://{urllib.parse.quote(name)}:{urllib.parse.quote(secret, safe='')}"
        f"@{host or ours.hostname or '127.0.0.1'}:{ours.port or 6379}{ours.path or '/0'}"
    )


# The test job: Python, run by the pool's interpreter; paths come from the pool (an admin's),
# written with repr, never from a user.
PROBE_SCRIPT = """\
import json, os, socket, sys
folder = {folder!r}
result = {{"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname()}}
try:
    import workers.slurmstep  # noqa: F401 - Trainyard's step wrapper
    result["workers"] = ""
except Exception as exc:
    result["workers"] = f"{{type(exc).__name__}}: {{exc}}"
try:
    with open(os.path.join(folder, "token")) as given:
        result["token"] = given.read()
except OSError as exc:
    result["token"] = f"{{type(exc).__name__}}: {{exc}}"
result["code_root"] = os.path.isdir({code_root!r})
try:
    import redis
    with open(os.path.join(folder, "credentials.url")) as given:
        url = given.read().strip()
    if url:
        redis.Redis.from_url(url, socket_connect_timeout=10).ping()
    result["redis"] = ""
except Exception as exc:
    result["redis"] = f"{{type(exc).__name__}}: {{exc}}"
with open(os.path.join(folder, "result.json"), "w") as out:
    json.dump(result, out)
"""


def _run_test_job(
    pool: SlurmPool, target: SlurmTarget, folder: Path, token: str, url: str
) -> list[Finding]:
    secret = folder / "credentials.url"
    secret.write_text(url + "\n")
    secret.chmod(0o600)
    script = folder / "check.py"
    script.write_text(
        f"#!{target.python}\n"
        + PROBE_SCRIPT.format(folder=str(folder), code_root=str(target.code_root))
    )
    script.chmod(0o700)
    argv = [
        "sbatch", "--parsable", "--job-name=trainyard-check", f"--partition={target.partition}",
        f"--chdir={folder}", f"--output={folder / 'slurm-%j.out'}", "--ntasks=1",
        "--time=2", f"--export={target.exported()}",
        *slurm_choices.sbatch_options(target.site_defaults, SlurmChoices()), str(script),
    ]  # fmt: skip
    try:
        slurm_id = run_client(argv, target).stdout.strip().split(";")[0]
    except SlurmError as exc:
        return [Finding(False, f"Slurm did not take the test job: {exc}")]
    answer = folder / "result.json"
    deadline = time.monotonic() + PROBE_SECONDS
    while not answer.exists():
        status = slurm_states.query(target, [slurm_id]).get(slurm_id)
        ended = status is None or status.state not in (Job.State.QUEUED, Job.State.RUNNING)
        if ended and not answer.exists():
            output = _output_of(folder, slurm_id)
            said = status.words if status is not None else "it ended"
            return [
                Finding(False, f"the test job (Slurm job {slurm_id}) ended without an answer: "
                        f"{said}; its output: {output or 'none'} (is {target.python} there on "
                        "the nodes, and the shared root at the same path?)")
            ]  # fmt: skip
        if time.monotonic() > deadline:
            run_client(["scancel", slurm_id], target)
            why = status.words if status is not None else ""
            return [
                Finding(False, f"the test job (Slurm job {slurm_id}) did not run within "
                        f"{PROBE_SECONDS:g} s: {why}; cancelled")
            ]  # fmt: skip
        time.sleep(POLL_SECONDS)
    return _findings(json.loads(answer.read_text()), target, token, slurm_id, url)


def _findings(
    result: dict[str, object], target: SlurmTarget, token: str, slurm_id: str, url: str
) -> list[Finding]:
    node = result.get("node")
    redis_at = urllib.parse.urlsplit(url)
    where = f"{redis_at.hostname}:{redis_at.port}"
    redis_said = str(result.get("redis") or "")
    tried_redis = [
        Finding(
            not redis_said,
            f"the console's Redis answers at {where} from {node}"
            if not redis_said
            else f"the console's Redis cannot be reached at {where} from {node}: {redis_said}. "
            "Give the pool a Redis host the nodes reach (--redis-host), and make the console's "
            "Redis listen there (`make run RUN_ARGS='--redis-also-on ADDRESS'`; docs/slurm.md)",
        )
    ]
    workers_said = str(result.get("workers") or "")
    token_said = str(result.get("token") or "")
    return [
        Finding(True, f"the test job ran on {node} (Slurm job {slurm_id})"),
        Finding(
            not workers_said,
            f"the pool's Python {target.python} imports Trainyard's workers package"
            if not workers_said
            else f"the pool's Python {target.python} cannot import Trainyard's workers "
            f"package on {node}: {workers_said}",
        ),
        Finding(
            token_said == token,
            f"the shared root {target.shared_root} is the same file system on {node}"
            if token_said == token
            else f"the shared root {target.shared_root} is not the same on {node}: "
            f"{token_said or 'it read something else'}",
        ),
        Finding(
            result.get("code_root") is True,
            f"the code root {target.code_root} is there on {node}"
            if result.get("code_root") is True
            else f"the code root {target.code_root} is not there on {node}",
        ),
        *(tried_redis if url else []),
    ]


def _output_of(folder: Path, slurm_id: str) -> str:
    try:
        text = (folder / f"slurm-{slurm_id}.out").read_text()
    except OSError:
        return ""
    return " ".join(text.split())[-400:]
