"""Django settings. Everything a deployment changes comes from the environment (see README)."""

import os
import secrets
import zoneinfo
from pathlib import Path

import dj_database_url
from redis.backoff import NoBackoff
from redis.retry import Retry

from console.env import (
    ImproperlyConfiguredEnv,
    comma_list,
    env_bool,
    env_either,
    env_float,
    env_int,
    env_path,
    env_str,
    secret_from_file,
)
from workers.redis_tls import celery_ssl_options

BASE_DIR = Path(__file__).resolve().parent.parent

# Runtime state of this checkout: database, Redis data, logs, secret key. `make run` and the
# tests point it elsewhere so that two copies never share state.
VAR_DIR = env_path("TRAINYARD_VAR_DIR", BASE_DIR / "var")


# TRAINYARD_ENV=production: the settings a shared deployment must make are required, and their
# development defaults (SQLite, a generated key, local host names) refused (docs/deploy.md).
PRODUCTION = env_str("TRAINYARD_ENV", "development") == "production"
if env_str("TRAINYARD_ENV", "development") not in ("development", "production"):
    raise ImproperlyConfiguredEnv("TRAINYARD_ENV is development (the default) or production")


def _secret_key() -> str:
    if os.environ.get("SECRET_KEY_FILE"):
        if env_either("SECRET_KEY", "DJANGO_SECRET_KEY", ""):
            raise ImproperlyConfiguredEnv("set SECRET_KEY or SECRET_KEY_FILE, not both")
        return secret_from_file("SECRET_KEY_FILE")
    from_env = env_either("SECRET_KEY", "DJANGO_SECRET_KEY", "")
    if from_env:
        return from_env
    if PRODUCTION:
        return ""  # refused below, with whatever else is missing
    # A stable key per checkout, so sessions survive restarts of `make run`.
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    key_file = VAR_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = comma_list(
    env_either("ALLOWED_HOSTS", "DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost")
)
CSRF_TRUSTED_ORIGINS = comma_list(
    env_either("CSRF_TRUSTED_ORIGINS", "DJANGO_CSRF_TRUSTED_ORIGINS", "")
)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    # API v1's docs page renders ninja's templates with its bundled Swagger UI from /static/
    # (no CDN: the console must work offline).
    "ninja",
    "jobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Above WhiteNoise, so that static files get these headers too.
    "jobs.security_headers.ContentSecurityPolicyMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # Before anything that reads the path or the query string (CommonMiddleware redirects).
    "jobs.request_text.RequestTextMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "jobs.login_throttle.LoginThrottleMiddleware",
    "jobs.api_fallback.ApiFallbackErrorsMiddleware",
    "jobs.upload_limit.SnapshotUploadLimitMiddleware",
    # A full disk (database, upload spool) answers 507 with a clear message, not a 500.
    "jobs.disk_full.DiskFullMiddleware",
]

# --- Headers on every response ---
# SecurityMiddleware sends the first three, XFrameOptionsMiddleware the fourth (these are
# Django's defaults, written out so that a reader sees what is promised).
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# jobs.security_headers sends this one. Pages load scripts and styles only from /static/ (data
# for scripts comes in json_script blocks), so no inline script or style runs; 'self' in
# connect-src covers the job page's fetches and its websocket to the same host and port.
SECURE_CSP: dict[str, list[str]] = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "font-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}


# --- TLS ---
# TRAINYARD_HTTPS=1 where users reach the console over https://. It assumes a reverse proxy that
# ends TLS and says so in X-Forwarded-Proto, setting that header itself on every request (never
# passing on one a client sent), and that nothing but the proxy reaches the web server
# (docs/operations.md). Then a plain-HTTP request is redirected to https://, cookies never
# travel over plain HTTP, and browsers are told to use only https:// for this host for
# TRAINYARD_HSTS_SECONDS (a year; 0 sends no HSTS header).
TRAINYARD_HTTPS = env_bool("TRAINYARD_HTTPS", False)
SECURE_SSL_REDIRECT = TRAINYARD_HTTPS
SESSION_COOKIE_SECURE = TRAINYARD_HTTPS
CSRF_COOKIE_SECURE = TRAINYARD_HTTPS
SECURE_HSTS_SECONDS = env_int("TRAINYARD_HSTS_SECONDS", 365 * 24 * 3600) if TRAINYARD_HTTPS else 0
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if TRAINYARD_HTTPS else None
# Health probes that ask the web server directly, over plain HTTP, get their answer, not a
# redirect.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        # Django's, with pages that are always text (jobs/page_templates.py).
        "BACKEND": "jobs.page_templates.PageTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "jobs.page_rules.rules",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        env="DATABASE_URL",
        default=f"sqlite:///{VAR_DIR / 'trainyard.sqlite3'}",
        # How long a process keeps its database connection (seconds; 0: one per request or
        # task). The console worker sets it (stack/run.py, deploy/): on PostgreSQL a new
        # connection for each of 200 heartbeats a second was a fifth of its ingest time
        # (issue 24). Checked before reuse, so a database that restarted costs one retry.
        conn_max_age=env_int("TRAINYARD_DB_CONN_MAX_AGE", 0),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The same backend, with write transactions that take turns (see its docstring).
    DATABASES["default"]["ENGINE"] = "console.sqlite_backend"
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock when a
        # transaction starts, so admission is serialised (SQLite ignores select_for_update).
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # In memory for unit tests; named so, pytest-xdist leaves it in memory in each process.
    DATABASES["default"]["TEST"] = {"NAME": ":memory:"}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's ModelBackend behind the login throttle (jobs/login_throttle.py).
AUTHENTICATION_BACKENDS = ["jobs.login_throttle.ThrottledModelBackend"]
# Sign-in through the organisation's LDAP directory (jobs/directory.py; docs/deploy.md):
# people in it sign in with their directory password, behind the same throttle; local
# accounts (the admin of a small set-up) keep theirs.
TRAINYARD_LDAP_URL = os.environ.get("TRAINYARD_LDAP_URL", "")
TRAINYARD_LDAP_GROUP_BASE = os.environ.get("TRAINYARD_LDAP_GROUP_BASE", "")
# How often the console worker asks the directory about everyone it signed in (0: never).
TRAINYARD_LDAP_CHECK_SECONDS = env_int("TRAINYARD_LDAP_CHECK_SECONDS", 300)
AUTH_LDAP_REQUIRE_GROUP: str | None = None
AUTH_LDAP_DENY_GROUP: str | None = None
if TRAINYARD_LDAP_URL:
    from console.directory_settings import ldap_settings

    globals().update(ldap_settings(os.environ))
    AUTHENTICATION_BACKENDS = ["jobs.directory.ThrottledDirectoryBackend"]
# Sign-in through the organisation's OpenID Connect provider (jobs/single_sign_on.py;
# docs/deploy.md), beside the passwords above; set, TRAINYARD_OIDC_CLIENT_ID turns it on.
TRAINYARD_OIDC_CLIENT_ID = os.environ.get("TRAINYARD_OIDC_CLIENT_ID", "")
TRAINYARD_OIDC_NAME = ""
TRAINYARD_OIDC_CLAIMS: dict[str, str] = {}
TRAINYARD_OIDC_GROUPS: list[str] = []
TRAINYARD_OIDC_REQUIRE_GROUP = ""
TRAINYARD_OIDC_STAFF_GROUP = ""
OIDC_OP_TOKEN_ENDPOINT = ""
if TRAINYARD_OIDC_CLIENT_ID:
    from console.sso_settings import oidc_settings

    globals().update(oidc_settings(os.environ))
    AUTHENTICATION_BACKENDS = [*AUTHENTICATION_BACKENDS, "jobs.single_sign_on.SingleSignOnBackend"]
# Wrong passwords allowed per account, and per client address (all accounts together), before
# that account or address is locked out; 0: no limit. Failures count for, and a lock lasts,
# TRAINYARD_LOGIN_LOCKOUT_SECONDS. Behind a proxy the address is the client's only if the web
# server trusts the proxy's X-Forwarded-For (uvicorn --forwarded-allow-ips; docs/operations.md).
TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT = env_int("TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT", 5)
TRAINYARD_LOGIN_FAILURES_PER_ADDRESS = env_int("TRAINYARD_LOGIN_FAILURES_PER_ADDRESS", 20)
TRAINYARD_LOGIN_LOCKOUT_SECONDS = env_int("TRAINYARD_LOGIN_LOCKOUT_SECONDS", 15 * 60)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "job_list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# The admin writes times as the console's own pages do (console/formats).
FORMAT_MODULE_PATH = ["console.formats"]
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Served straight from static/ by WhiteNoise, without a collectstatic step; a deployment that
# wants collected files sets DJANGO_STATIC_ROOT.
STATIC_ROOT = env_str("DJANGO_STATIC_ROOT", "") or None
WHITENOISE_USE_FINDERS = True

# Request bodies: a job request is small; anything larger is refused with a clear 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

# Redis carries Celery messages, the per-job log streams and the channel layer. `make run`
# starts a private redis-server and passes its URL; nothing falls back to a shared server.
REDIS_URL = env_str("REDIS_URL", "")


def channel_layers(redis_url: str) -> dict[str, object]:
    # socket_timeout None: redis-py 8 defaults to 5 s, which races channels_redis's own 5 s
    # blocking BZPOPMIN and kills idle websockets (channels_redis issue 422).
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": redis_url, "socket_timeout": None}]},
        }
    }


CHANNEL_LAYERS = channel_layers(REDIS_URL or "redis://127.0.0.1:1/0")


def cache_settings(redis_url: str) -> dict[str, object]:
    """Django's cache (it holds the login throttle's counts): in Redis, so that every web
    process shares it; in process memory where there is no Redis (unit tests, manage.py).
    It shares the Redis database with Celery and the log streams: never cache.clear() it."""
    if not redis_url:
        return {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_url,
            "KEY_PREFIX": "trainyard-cache",
            # A login must not wait on a Redis that hangs: short timeouts, no retries (the
            # throttle lets the attempt through instead).
            "OPTIONS": {
                "socket_connect_timeout": 1,
                "socket_timeout": 1,
                "retry": Retry(NoBackoff(), 0),
            },
        }
    }


CACHES = cache_settings(REDIS_URL)

CELERY_BROKER_URL = REDIS_URL or "redis://127.0.0.1:1/0"
# rediss://: the certificate checks the URL asks for (workers/redis_tls.py).
CELERY_BROKER_USE_SSL = celery_ssl_options(CELERY_BROKER_URL)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = "console"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# Where users' training scripts live; a job's script path must resolve inside it.
TRAINYARD_CODE_ROOT = env_path("TRAINYARD_CODE_ROOT", BASE_DIR / "code")
# Code snapshots (POST /api/v1/snapshots): the largest archive taken, and what its files may come
# to unpacked. An archive travels to the agents through Redis and is kept in the database.
TRAINYARD_SNAPSHOT_MAX_BYTES = env_int("TRAINYARD_SNAPSHOT_MAX_MB", 100) * 2**20
TRAINYARD_SNAPSHOT_MAX_UNPACKED_BYTES = env_int("TRAINYARD_SNAPSHOT_MAX_UNPACKED_MB", 1024) * 2**20
# How many uploads one web process checks and packs at once; the others wait their turn, up to
# TRAINYARD_SNAPSHOT_CHECK_WAIT_SECONDS, then get a 503. The work holds Python's GIL: a burst of
# uploads checked all at once would leave every other request of the process a sliver of it.
TRAINYARD_SNAPSHOT_CHECKS_AT_ONCE = env_int("TRAINYARD_SNAPSHOT_CHECKS_AT_ONCE", 2)
TRAINYARD_SNAPSHOT_CHECK_WAIT_SECONDS = env_float("TRAINYARD_SNAPSHOT_CHECK_WAIT_SECONDS", 60.0)

# Retention (jobs.services.retention, docs/operations.md): an ended job's log and metrics are
# deleted this many days after it ended, unless the job is kept or has days of its own (0: kept
# forever). Code snapshots that no job and no upload names are collected too. The console worker
# prunes every TRAINYARD_RETENTION_SECONDS (0: never on its own; `manage.py prune` still does).
TRAINYARD_LOG_RETENTION_DAYS = env_int("TRAINYARD_LOG_RETENTION_DAYS", 90)
TRAINYARD_RETENTION_SECONDS = env_float("TRAINYARD_RETENTION_SECONDS", 3600.0)
if TRAINYARD_LOG_RETENTION_DAYS < 0 or TRAINYARD_RETENTION_SECONDS < 0:
    raise ImproperlyConfiguredEnv(
        "TRAINYARD_LOG_RETENTION_DAYS and TRAINYARD_RETENTION_SECONDS must be 0 or more"
    )

# How often the console worker refreshes SQLite's query planner statistics (ANALYZE, sampled:
# jobs.services.planner_stats), and once when it starts; 0: never. PostgreSQL keeps its own.
TRAINYARD_DB_STATISTICS_SECONDS = env_float("TRAINYARD_DB_STATISTICS_SECONDS", 3600.0)
if TRAINYARD_DB_STATISTICS_SECONDS < 0:
    raise ImproperlyConfiguredEnv("TRAINYARD_DB_STATISTICS_SECONDS must be 0 or more")

# How long a node may stay silent before placement stops using it.
TRAINYARD_NODE_STALE_SECONDS = env_int("TRAINYARD_NODE_STALE_SECONDS", 15)
# Reconciliation (jobs.services.reconcile) compares what the database says should run with what
# agents say does run, every TRAINYARD_RECONCILE_SECONDS (0: the console worker runs no loop).
TRAINYARD_RECONCILE_SECONDS = env_float("TRAINYARD_RECONCILE_SECONDS", 5.0)
# The Slurm pass (jobs.services.slurm.slurm_pass) submits, follows and stops the jobs of Slurm pools
# every TRAINYARD_SLURM_SECONDS (0: never; then no job of a Slurm pool ever starts).
TRAINYARD_SLURM_SECONDS = env_float("TRAINYARD_SLURM_SECONDS", 1.0)

# Experiments (jobs/services/experiments): where Optuna keeps each search's state. "" (the
# default): beside the console's database, a sibling SQLite file of the default SQLite one
# (trainyard-search.sqlite3) or, on PostgreSQL, the same database through SQLAlchemy's psycopg
# driver. Any SQLAlchemy URL otherwise (postgresql+psycopg://…).
TRAINYARD_SEARCH_DATABASE_URL = os.environ.get("TRAINYARD_SEARCH_DATABASE_URL", "")
# The console worker judges running trials and advances experiments every this many seconds,
# besides at once when a trial's job ends or its objective arrives (0: never on a timer).
TRAINYARD_EXPERIMENT_SWEEP_SECONDS = env_float("TRAINYARD_EXPERIMENT_SWEEP_SECONDS", 10.0)
# How a pool whose jobs run as their owners submits a person's job: "options" (root runs sbatch
# --uid/--gid, Slurm 22.05's way), "person" (sbatch runs as the person, with their uid, gid and
# groups: for releases whose sbatch has no --uid), or "auto": "options" where the cluster's
# sbatch lists --uid in its help, else "person" (jobs/services/slurm/slurm_identity.py).
TRAINYARD_SLURM_SUBMIT_AS = env_str("TRAINYARD_SLURM_SUBMIT_AS", "auto")
if TRAINYARD_SLURM_SUBMIT_AS not in ("auto", "options", "person"):
    raise ImproperlyConfiguredEnv(
        f"TRAINYARD_SLURM_SUBMIT_AS={TRAINYARD_SLURM_SUBMIT_AS!r}: auto, options or person"
    )
# A node silent this long (while the console could hear it) is lost: its replicas fail.
TRAINYARD_NODE_LOST_SECONDS = env_int("TRAINYARD_NODE_LOST_SECONDS", 45)
# A misbehaving agent cannot slow the others (jobs/services/heartbeat_limits.py): of one
# agent's heartbeats one in this many seconds is taken, and a heartbeat listing more replicas
# than this is refused, each with a log line.
TRAINYARD_HEARTBEAT_MIN_SPACING_SECONDS = env_float("TRAINYARD_HEARTBEAT_MIN_SPACING_SECONDS", 0.5)
TRAINYARD_HEARTBEAT_MAX_ENTRIES = env_int("TRAINYARD_HEARTBEAT_MAX_ENTRIES", 2000)
# Heartbeats arriving within this many seconds of each other are written in one transaction
# (jobs/services/heartbeat_batch.py); 0: each in its own, as it comes.
TRAINYARD_HEARTBEAT_BATCH_SECONDS = env_float("TRAINYARD_HEARTBEAT_BATCH_SECONDS", 0.1)
# The console worker takes heartbeats off a Redis list that agents push onto, past Celery and
# its per-task cost (jobs/services/heartbeat_drain.py); off: it never says it drains, and
# agents send every heartbeat as a Celery task.
TRAINYARD_HEARTBEAT_DRAIN = env_bool("TRAINYARD_HEARTBEAT_DRAIN", True)
# Node agents (docs/deploy.md): each has its own Redis ACL user and signs what it reports
# (`manage.py agent_credentials NODE`). Off, a node without credentials is believed unsigned:
# only for a development set-up whose agents use the console's own Redis URL. A node that has
# credentials must sign either way.
TRAINYARD_REQUIRE_AGENT_CREDENTIALS = env_bool("TRAINYARD_REQUIRE_AGENT_CREDENTIALS", True)
# A signed report older than this is refused (a bound on replaying a captured one); reports wait
# in the queue while the console worker is down, so it is generous.
TRAINYARD_REPORT_MAX_AGE_SECONDS = env_int("TRAINYARD_REPORT_MAX_AGE_SECONDS", 3600)
# How long after a node's last replica of a job ended its agent may still write the job's keys
# (its last log lines, from its disk spool after an outage).
TRAINYARD_AGENT_GRANT_LINGER_SECONDS = env_int("TRAINYARD_AGENT_GRANT_LINGER_SECONDS", 600)
# How long a start or stop message may go unacknowledged by heartbeats before it is sent again
# (or the replica is judged gone): covers a message in flight and one heartbeat interval.
TRAINYARD_ACK_GRACE_SECONDS = env_int("TRAINYARD_ACK_GRACE_SECONDS", 30)
# Start messages sent for one replica before it fails as never started.
TRAINYARD_START_ATTEMPTS = env_int("TRAINYARD_START_ATTEMPTS", 3)
# How long the first job in the queue may be passed by smaller jobs that fit (backfill) before
# the queue turns strictly first come, first served so that it cannot starve.
TRAINYARD_BACKFILL_GRACE_SECONDS = env_int("TRAINYARD_BACKFILL_GRACE_SECONDS", 300)
# Fair share (jobs.services.scheduler.fairshare): a tenant's past usage counts half as much after
# this long, so that yesterday's burst is forgiven while this hour's is not.
TRAINYARD_FAIR_SHARE_HALF_LIFE_SECONDS = env_int("TRAINYARD_FAIR_SHARE_HALF_LIFE_SECONDS", 21600)
if TRAINYARD_FAIR_SHARE_HALF_LIFE_SECONDS < 1:
    raise ImproperlyConfiguredEnv("TRAINYARD_FAIR_SHARE_HALF_LIFE_SECONDS must be 1 or more")
# The time limit of a job that sets none and whose groups' quotas give no default (0: none).
# With time limits known, backfill reserves the head's start instead of using the grace above.
TRAINYARD_DEFAULT_TIME_LIMIT_SECONDS = env_int("TRAINYARD_DEFAULT_TIME_LIMIT_SECONDS", 0)
# Between the SIGTERM and the SIGKILL of a job past its time limit: time to checkpoint.
TRAINYARD_TIME_LIMIT_GRACE_SECONDS = env_int("TRAINYARD_TIME_LIMIT_GRACE_SECONDS", 30)
# Preemption (jobs.services.scheduler.preemption): a job preempted once is not preempted again until
# its next attempt has run this long (no preemption loops), and a victim's processes get this long
# between SIGTERM and SIGKILL to save a checkpoint.
TRAINYARD_PREEMPTION_MIN_RUN_SECONDS = env_int("TRAINYARD_PREEMPTION_MIN_RUN_SECONDS", 600)
TRAINYARD_PREEMPTION_GRACE_SECONDS = env_int("TRAINYARD_PREEMPTION_GRACE_SECONDS", 30)
# An elastic job grows only once it has run at its size this long (jobs.services.lifecycle
# .elastic): each resize is a checkpoint and a restart, and room that comes and goes would
# otherwise keep it restarting instead of training.
TRAINYARD_ELASTIC_SETTLE_SECONDS = env_int("TRAINYARD_ELASTIC_SETTLE_SECONDS", 60)
# Whether jobs may run on a node whose agent cannot sandbox its trainers (no bubblewrap, or no
# user namespaces and not root): there a training script can read what the agent can, other
# users' jobs included (docs/security.md). Off in production unless an admin turns it on.
TRAINYARD_ALLOW_UNISOLATED_NODES = env_bool("TRAINYARD_ALLOW_UNISOLATED_NODES", not PRODUCTION)
# Upper bound on instances of one role: a typo like 10000 must not create 10000 rows.
TRAINYARD_MAX_INSTANCES = env_int("TRAINYARD_MAX_INSTANCES", 64)
# The currency packages are priced in (an ISO 4217 code): pages show prices and "samples per
# dollar" in it. Only the label changes; the amounts are the packages' own.
TRAINYARD_CURRENCY = env_str("TRAINYARD_CURRENCY", "USD").strip().upper()
if not (
    len(TRAINYARD_CURRENCY) == 3 and TRAINYARD_CURRENCY.isascii() and TRAINYARD_CURRENCY.isalpha()
):
    raise ImproperlyConfiguredEnv(
        f"TRAINYARD_CURRENCY={TRAINYARD_CURRENCY!r} is not a three-letter currency code (USD, EUR)"
    )
# The time zone the pages and the CLI show times in (an IANA name, e.g. Europe/Berlin), for a
# team that wants one clock on every screen; empty: each reader's own zone.
TRAINYARD_TIME_ZONE = env_str("TRAINYARD_TIME_ZONE", "").strip()
if TRAINYARD_TIME_ZONE:
    try:
        zoneinfo.ZoneInfo(TRAINYARD_TIME_ZONE)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ImproperlyConfiguredEnv(
            f"TRAINYARD_TIME_ZONE={TRAINYARD_TIME_ZONE!r} is not a time zone (e.g. Europe/Berlin, "
            "UTC); leave it empty for each reader's own"
        ) from None
# A log websocket whose client has not taken one frame in this long is closed (code 4408) and
# resumes from its cursor, rather than having the server buffer for it without bound.
TRAINYARD_WS_SEND_TIMEOUT_SECONDS = env_int("TRAINYARD_WS_SEND_TIMEOUT_SECONDS", 20)
# An open websocket checks again, this often, that the token or session it was opened with
# still holds (and closes with 4401 if not). Revoking a token, deactivating a user or changing
# a password tells the streams at once; this is the fallback for a message that was lost.
TRAINYARD_WS_RECHECK_SECONDS = env_int("TRAINYARD_WS_RECHECK_SECONDS", 5)

# /healthz tells anyone only "up" or "down"; staff, and callers that send this token
# (Authorization: Token …, e.g. a monitoring system), also get which part fails and how many
# nodes are live. Empty: staff only. `make run` sets one of its own for its readiness check.
TRAINYARD_HEALTHZ_TOKEN = env_str("TRAINYARD_HEALTHZ_TOKEN", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"client_errors": {"()": "console.logfilters.NoClientErrorTracebacks"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("TRAINYARD_LOG_LEVEL", "INFO")},
    # A refused request is a line, not a traceback (console/logfilters.py).
    "loggers": {"django.request": {"filters": ["client_errors"]}},
}


def _production_problems() -> list[str]:
    problems = []
    if not SECRET_KEY:
        problems.append(
            "SECRET_KEY_FILE (or SECRET_KEY) must give the key every web process shares"
        )
    if DEBUG:
        problems.append("DJANGO_DEBUG must be off")
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        problems.append("DATABASE_URL must name the PostgreSQL database (postgres://...)")
    if not REDIS_URL:
        problems.append("REDIS_URL must name the shared Redis (redis://:PASSWORD@host:6379/0)")
    elif "@" not in REDIS_URL:
        problems.append("REDIS_URL carries no password: a shared Redis must require one")
    if not env_either("ALLOWED_HOSTS", "DJANGO_ALLOWED_HOSTS", ""):
        problems.append("ALLOWED_HOSTS must list the console's host names")
    return problems


if PRODUCTION and (_problems := _production_problems()):
    raise ImproperlyConfiguredEnv(
        "TRAINYARD_ENV=production, but: " + "; ".join(_problems) + " (docs/deploy.md)"
    )
