"""Fixtures shared by every test: a private real Redis, named users, the catalog and nodes."""

import asyncio
import concurrent.futures
import contextlib
import io
import itertools
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psutil
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone

from console.settings import channel_layers
from jobs.models import Job, Node, Quota
from jobs.redis_client import get_redis
from stack.redis_server import free_port
from stack.redis_server import private_server as private_redis
from workers.contract import tag_of

if TYPE_CHECKING:
    from stack.run import Stack

T = TypeVar("T")

FIXTURE_CODE_ROOT = Path(__file__).parent / "fixtures" / "code"

# Trainers run sandboxed (workers/sandbox.py) and see nothing of the host but their own job, so
# the files a test makes for them to notice (hold.py's --release) go in one folder that every
# agent the tests start shares with its trainers, read-only (the agent's --sandbox-share, read
# from the environment every stack inherits). pytest's own tmp_path folders are 0700: a
# trainer, which runs as a user of its own, could not look inside them anyway.
SIGNALS_DIR = Path(tempfile.mkdtemp(prefix="trainyard-test-signals-"))
SIGNALS_DIR.chmod(0o755)
os.environ["TRAINYARD_SANDBOX_SHARED"] = str(SIGNALS_DIR)


def signal_file(name: str = "release") -> Path:
    """A path no test has used, in the folder trainers can see; the test creates the file."""
    return SIGNALS_DIR / f"{name}-{uuid.uuid4().hex}"


@pytest.fixture
def release() -> Path:
    """Where a test's hold.py looks for its release file (the test touches it to end the job)."""
    return signal_file()


# Lines the API fuzz (tests/integration/test_api_fuzz.py) leaves for the end of the output.
FUZZ_SUMMARY = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = config.stash.get(FUZZ_SUMMARY, [])
    if lines:
        terminalreporter.section("API fuzz (Schemathesis, against the running server)")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test`'s --dist loadfile, with the browser tests and the tests that change the
    host's network handed out as one file (tests/file_groups.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.file_groups import FileGroupScheduling

    return FileGroupScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist's controller: the fuzz ran in a worker process (`make test` runs two), whose
    stash the controller never sees; the worker hands its lines over at its end."""
    lines = getattr(node, "workeroutput", {}).get("fuzz_summary", [])
    node.config.stash.setdefault(FUZZ_SUMMARY, []).extend(lines)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Redis the unit tests share."""
    with private_redis(tmp_path_factory.mktemp("redis")) as (url, _):
        yield url


@pytest.fixture
def redis_url(redis_server: str, settings: Any) -> Iterator[str]:
    """Point the console's Redis clients and channel layer at the test Redis, emptied."""
    settings.REDIS_URL = redis_server
    settings.CHANNEL_LAYERS = channel_layers(redis_server)
    get_redis.cache_clear()
    get_redis().flushdb()
    yield redis_server
    get_redis.cache_clear()


@pytest.fixture
def code_root(settings: Any) -> Path:
    settings.TRAINYARD_CODE_ROOT = FIXTURE_CODE_ROOT
    return FIXTURE_CODE_ROOT


@pytest.fixture
def catalog(db: None) -> None:
    call_command("load_catalog", stdout=io.StringIO())


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice", password="alice-password")


@pytest.fixture
def bob(db: None) -> User:
    return User.objects.create_user("bob", password="bob-password")


@pytest.fixture
def charlie_admin(db: None) -> User:
    return User.objects.create_superuser("charlie", password="charlie-password")


@pytest.fixture
def nodes(db: None) -> list[Node]:
    """Two live nodes of 8 cores and 32 GB each, as `make run` starts them (4 cores there)."""
    now = timezone.now()
    return [
        Node.objects.create(
            name=f"node-{i}", address="127.0.0.1", cpu=8, memory_gb=32, last_heartbeat=now
        )
        for i in (1, 2)
    ]


def process_alive(pid: int) -> bool:
    """Running, not merely a zombie: an orphan's zombie waits for PID 1 to reap it, and this
    sandbox's PID 1 may never do so."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def job_processes(job_id: int) -> list[psutil.Process]:
    """Every live process on this host whose environment says it belongs to the job: its
    trainers, what they started, and the sandbox's own processes around them. (Trainers run in
    PID namespaces of their own: the pids they print of themselves mean nothing out here.)"""
    found = []
    for proc in psutil.process_iter():
        try:
            if (
                proc.environ().get("TRAINYARD_JOB_ID") == str(job_id)
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def escape_verdicts(texts: Iterable[str]) -> dict[str, str]:
    """What tests/fixtures/code/escape.py printed, by attempt: {"path:/x": "BLOCKED ...", ...}."""
    verdicts = {}
    for text in texts:
        kind, _, rest = text.partition(" ")
        if kind in ("ESCAPE", "CONTROL") and rest != "done":
            name, _, verdict = rest.partition(" ")
            verdicts[name] = verdict
    return verdicts


def trainer_pids(job_id: int) -> dict[str, int]:
    """The host pid of each trainer process of the job, by its instance's tag ("master",
    "worker-1"; "worker-1/1" for local rank 1): the processes that run the job's script, not
    the sandbox's processes around them nor what the trainers started."""
    found = {}
    for proc in job_processes(job_id):
        try:
            argv, env = proc.cmdline(), proc.environ()
        except psutil.Error:
            continue
        if len(argv) < 2 or not argv[1].endswith(".py") or "bwrap" in argv[0]:
            continue
        tag = tag_of(env["TRAINYARD_ROLE"], int(env["TRAINYARD_INDEX"]))
        local = env.get("LOCAL_RANK", "0")
        found[tag if local == "0" else f"{tag}/{local}"] = proc.pid
    return found


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to the end on a fresh loop in its own thread.

    Playwright's sync API keeps a loop marked as running in the main thread for the whole
    session, so asyncio.run() there would refuse to start.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def make_stale(node: Node) -> None:
    node.last_heartbeat = timezone.now() - timedelta(minutes=5)
    node.save()


def set_quota(user: User, cpu: int = 8, gpus: int = 0, memory_gb: int = 32, jobs: int = 4) -> Quota:
    return Quota.objects.create(
        user=user, cpu=cpu, gpus=gpus, memory_gb=memory_gb, running_jobs=jobs
    )


def required_here(what: str, reason: str | None) -> None:
    """A part of the suite that needs something of the host (`reason`: why it is missing,
    None when it is there): skipped with the reason on a developer's machine, but under
    CI=true a failure, since there a skip would hide a broken set-up."""
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run {what}, but {reason}")
    pytest.skip(f"SKIPPED, not run: {reason}")


def require_postgres() -> None:
    """Skip (with the reason) where no PostgreSQL server answers; under CI=true, fail: CI
    must run what needs it."""
    from bench.databases import postgres_unreachable_reason

    required_here("the tests that need PostgreSQL", postgres_unreachable_reason())


# --- the real stack, for integration and browser tests ------------------------------------------


class RunningStack:
    """A started `stack.run.Stack` with an admin login and API clients."""

    def __init__(self, stack: "Stack", admin_password: str, admin_token: str | None = None) -> None:
        self.stack = stack
        self.url = stack.url
        self.admin_password = admin_password
        self.admin = StackClient(self.url, admin_token) if admin_token else self.client_for("admin")

    def client_for(self, username: str) -> "StackClient":
        return StackClient(self.url, self.stack.manage("token", username).strip())

    def add_package(self, prefix: str, **fields: Any) -> str:
        """A package of a test module's own, named `prefix`-<random> (the catalog's stay as
        they are); `retire_packages(prefix)` takes them off the form again."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        values = {"cpu": 1, "memory_gb": 2, **fields}
        self.stack.manage(
            "shell", "-c",
            f"from jobs.models import Package; Package.objects.create(name={name!r}, **{values!r})",
        )  # fmt: skip
        return name

    def retire_packages(self, prefix: str) -> None:
        """The stack is shared: its New-job form offers the smallest package first, and a 1 GB
        package of a module's would otherwise be every later test's default."""
        self.stack.manage(
            "shell", "-c",
            "from jobs.models import Package; "
            f"Package.objects.filter(name__startswith={prefix + '-'!r}).update(enabled=False)",
        )  # fmt: skip

    def create_user(
        self, username: str, password: str, quota: dict[str, int] | None = None
    ) -> "StackClient":
        """A user of this stack (with a quota of their own when given one: cpu, gpus, memory_gb,
        running_jobs), and an API client for them. A test that owns its user depends on no
        other test's jobs for what its quota has left."""
        # One Django start for the user, their quota and their key (what `manage.py token`
        # issues), not one for the user and another for the key: 60-odd tests make users.
        code = (
            "from django.contrib.auth.models import User; from jobs.models import Quota; "
            "from jobs.services import tokens; "
            f"user = User.objects.create_user({username!r}, password={password!r})"
        )
        if quota is not None:
            code += f"; Quota.objects.create(user=user, **{quota!r})"
        code += "; print(tokens.issue(user, 'manage.py').key)"
        token = self.stack.manage("shell", "-c", code).strip().splitlines()[-1]
        return StackClient(self.url, token)


class StackClient:
    def __init__(self, url: str, token: str) -> None:
        import httpx

        self.token = token
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Token {token}"}, timeout=30
        )

    def submit(self, request: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post("/api/v1/jobs", json=request)
        assert response.status_code == 201, response.text
        return response.json()

    def job(self, job_id: int) -> dict[str, Any]:
        response = self.http.get(f"/api/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def upload(self, folder: Path, name: str) -> str:
        """Upload a folder as a code snapshot; its SHA-256, which is the console's name for
        exactly the files `trainyard submit` uploads from it."""
        from tests.snapshots import snapshot_of

        packed = snapshot_of(folder)
        response = self.http.post(
            "/api/v1/snapshots",
            files={"archive": ("code.tar.gz", packed.archive, "application/gzip")},
            data={"name": name},
        )
        assert response.status_code in (200, 201), response.text
        sha: str = response.json()["sha256"]
        assert sha == packed.sha256
        return sha

    def wait(
        self, job_id: int, until: Callable[[dict[str, Any]], bool], hang_guard: float = 300
    ) -> dict[str, Any]:
        """Poll until `until(job)`; the guard only stops a hung test, it measures nothing."""
        deadline = time.monotonic() + hang_guard
        for pause in poll_pauses():
            job = self.job(job_id)
            if until(job):
                return job
            assert time.monotonic() < deadline, f"job {job_id} stuck: {job}"
            time.sleep(pause)
        raise AssertionError("unreachable: poll_pauses never ends")

    def wait_finished(self, job_id: int) -> dict[str, Any]:
        return self.wait(job_id, lambda j: j["state"] in TERMINAL and j["log_complete"])

    def logs(self, job_id: int, **params: Any) -> list[dict[str, Any]]:
        """The whole log, paged through with `after`."""
        lines: list[dict[str, Any]] = []
        after = 0
        while True:
            response = self.http.get(
                f"/api/v1/jobs/{job_id}/logs", params={"after": after, **params}
            )
            assert response.status_code == 200, response.text
            page = response.json()
            lines.extend(page["lines"])
            if page["complete"] or page["next"] == after:
                return lines
            after = page["next"]


TERMINAL = {"succeeded", "failed", "cancelled"}


def frame_lines(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """The lines of a websocket "log" frame, one dict each (as the HTTP API gives them)."""
    if frame["type"] != "log":
        return []
    return [
        {"cursor": b["first"] + k, "role": b["role"], "index": b["index"], "node": b["node"],
         "stream": b["stream"], "ts": b["ts"], "text": text}
        for b in frame["batches"]
        for k, text in enumerate(b["lines"])
    ]  # fmt: skip


HANG_GUARD = 180.0  # stops a hung test; measures nothing


def poll_pauses() -> Iterator[float]:
    """The pauses between two looks at a condition: short at first (most conditions a test
    waits on hold within a second or two), then longer, up to half a second. A wait of
    minutes (a job that trains, a node's grace running out) then costs a few hundred API
    requests instead of thousands: each is web server and test CPU that the stacks of both
    pytest processes need."""
    pause = 0.1
    for _ in range(20):  # the first two seconds
        yield pause
    while True:
        pause = min(pause * 1.25, 0.5)
        yield pause


def wait_until(what: str, check: Callable[[], Any], guard: float = HANG_GUARD) -> Any:
    """Poll `check` until it returns something true, and return that."""
    deadline = time.monotonic() + guard
    for pause in poll_pauses():
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(pause)
    raise AssertionError("unreachable: poll_pauses never ends")


def page_for(stack: RunningStack, username: str, password: str, path: str) -> str:
    """A console page as the user's browser gets it (logged in with a session)."""
    import httpx

    with httpx.Client(base_url=stack.url, timeout=30) as browser:
        browser.get("/accounts/login/")
        answer = browser.post(
            "/accounts/login/",
            data={
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            },
        )
        assert answer.status_code in (200, 302), answer.text
        page = browser.get(path)
        assert page.status_code == 200, page.text
        return page.text


UNLIMITED_IMAGE = "pytorch:2.13-cpu-no-log-limits"


def unlimited_image(stack: RunningStack) -> str:
    """The name of a copy of pytorch:2.13-cpu without (practical) log limits, made once per
    stack: for tests of what the log path carries, whose floods the default limits would cut."""
    stack.stack.manage(
        "shell",
        "-c",
        "from jobs.models import FrameworkImage\n"
        f"if not FrameworkImage.objects.filter(name={UNLIMITED_IMAGE!r}).exists():\n"
        "    image = FrameworkImage.objects.get(name='pytorch:2.13-cpu')\n"
        f"    image.pk, image.name = None, {UNLIMITED_IMAGE!r}\n"
        "    image.log_lines_per_second, image.log_max_mb = 10**8, 10**7\n"
        "    image.save()",
    )
    return UNLIMITED_IMAGE


def pytorch_request(
    name: str, script: str, instances: int, package: str = "cpu-1", args: list[str] | None = None
) -> dict[str, Any]:
    roles: dict[str, Any] = {"master": {"package": package, "instances": 1}}
    if instances > 1:
        roles["worker"] = {"package": package, "instances": instances - 1}
    return {
        "name": name,
        "image": "pytorch:2.13-cpu",
        "program": {"script": script, "args": args or []},
        "roles": roles,
    }


_stacks_numbered = itertools.count()


def number_jobs_apart(stack: "Stack") -> None:
    """Start a prepared stack's job ids in a block no other stack of this run uses.

    Tests find a job's processes on this host by their TRAINYARD_JOB_ID (job_processes), and
    `make test` runs two pytest processes, each with stacks of its own: without this, job 5 of
    one stack would be taken for job 5 of the other. The blocks start far above the small ids
    the unit tests give the jobs they start agents for."""
    stack.manage("shell", "-c", f"from tests.job_ids import start_at; start_at({first_job_id()})")


def first_job_id() -> int:
    """The first job id of the next stack this process starts (see number_jobs_apart)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return (int(worker or 0) + 1) * 10_000_000 + next(_stacks_numbered) * 100_000


# The first SQLite stack this pytest process starts is prepared the long way, in a folder of
# its own; every later one starts from copies of what that left (see prepare_from_template).
_TEMPLATE: dict[str, Any] = {}
TEMPLATE_FILES = ("trainyard.sqlite3", "admin-password")


def prepare_from_template(stack: "Stack") -> tuple[str, str | None]:
    """What stack.prepare() and number_jobs_apart() make, in a fraction of the time; returns
    the admin's password and, where known, an API key of theirs.

    Migrating a fresh SQLite database, loading the catalog, making the admin and numbering the
    jobs are four Django starts, 15-20 s on a quiet 2-core machine and a minute on a loaded
    one, and every stack of a run would end with the same rows but for the admin's random
    password and the first job id. None of them reads the environment a test gives its stack
    (its timings, its code root), so this process's first stack has stack.prepare() run in a
    template folder once, with a key issued for the admin (keys are kept as plain SHA-256
    digests, valid in any copy), and each stack gets a copy of that database and the admin's
    password file, then its own block of job ids. A stack on another database (DATABASE_URL:
    PostgreSQL) is prepared the long way."""
    if "DATABASE_URL" in stack.extra_env:
        login = stack.prepare()
        number_jobs_apart(stack)
        return login.split(" ", 1)[1], None
    if not _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="trainyard-test-template-"))
        model = type(stack)(var_dir=folder, port=free_port(), nodes=0)
        _TEMPLATE["password"] = model.prepare().split(" ", 1)[1]
        _TEMPLATE["admin_token"] = model.manage("token", "admin").strip()
        _TEMPLATE["folder"] = folder
    stack.keep_var_private()
    (stack.var_dir / "logs").mkdir(exist_ok=True)
    for name in TEMPLATE_FILES:
        shutil.copy2(_TEMPLATE["folder"] / name, stack.var_dir / name)
    # What tests/job_ids.start_at does in a stack's shell, without a Django start of its own.
    with contextlib.closing(sqlite3.connect(stack.var_dir / TEMPLATE_FILES[0])) as db, db:
        table = Job._meta.db_table
        db.execute("DELETE FROM sqlite_sequence WHERE name = ?", [table])
        db.execute(
            "INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", [table, first_job_id() - 1]
        )
    return _TEMPLATE["password"], _TEMPLATE["admin_token"]


@contextlib.contextmanager
def running_stack(
    var_dir: Path,
    nodes: int = 2,
    extra_env: dict[str, str] | None = None,
    code_root: Path = FIXTURE_CODE_ROOT,
    redis_also_on: tuple[str, ...] = (),
) -> Iterator[RunningStack]:
    """Redis, the ASGI server, the console worker, the log keeper and node agents, as
    `make run` runs them, stopped by PID on the way out."""
    from stack.run import Stack

    running = Stack(
        var_dir=var_dir,
        port=free_port(),
        nodes=nodes,
        node_cpus=4,
        node_memory_gb=16,
        code_root=code_root,
        extra_env=dict(extra_env or {}),
        redis_also_on=redis_also_on,
    )
    password, admin_token = prepare_from_template(running)
    try:
        running.start()
        yield RunningStack(running, password, admin_token)
    finally:
        running.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """The stack the integration and browser tests share."""
    with running_stack(tmp_path_factory.mktemp("stack")) as running:
        yield running


# Short timings so that a lost node is judged in seconds, not the production minute.
FAST_FAULTS = {
    "TRAINYARD_HEARTBEAT_SECONDS": "1",
    "TRAINYARD_NODE_STALE_SECONDS": "4",
    # A node is lost after the keepers' grace: an agent back within it takes its replicas over
    # (the kill-9-and-back-5-s-later test needs room for the agent's own start, on 2 loaded
    # cores); one that stays away loses them to its keepers, and then its node.
    "TRAINYARD_NODE_LOST_SECONDS": "14",
    "TRAINYARD_KEEPER_GRACE_SECONDS": "12",
    "TRAINYARD_ACK_GRACE_SECONDS": "4",
    "TRAINYARD_RECONCILE_SECONDS": "1",
    # An elastic job grows once its size has held this long (production: a minute).
    "TRAINYARD_ELASTIC_SETTLE_SECONDS": "3",
}


@pytest.fixture(scope="session")
def fault_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """A stack of its own for tests that break its processes, with FAST_FAULTS timings."""
    with running_stack(tmp_path_factory.mktemp("faults"), extra_env=FAST_FAULTS) as running:
        yield running


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: see pytest_testnodedown
        workeroutput["fuzz_summary"] = session.config.stash.get(FUZZ_SUMMARY, [])
    shutil.rmtree(SIGNALS_DIR, ignore_errors=True)
    if _TEMPLATE:
        shutil.rmtree(_TEMPLATE["folder"], ignore_errors=True)
