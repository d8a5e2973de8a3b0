"""Catalog (images, packages), nodes, quotas, jobs and their replicas.

Job and replica states, and the transitions between them, are declared here, once; they are
written only by `jobs.services.lifecycle.transitions`, which refuses any transition these tables do
not allow. Everything else reads.
"""

import hashlib
import secrets
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobs import container_refs
from jobs.arglists import merge
from jobs.envvars import env_problems
from jobs.labels import (
    NOTE_MAX,
    PROJECT_MAX,
    TAG_MAX,
    validate_note,
    validate_project,
    validate_tag,
)
from jobs.text import validate_name
from workers import contract
from workers.cgroups import Layout
from workers.contract import masked_env, tag_of
from workers.sandbox import Isolation


class Framework(models.TextChoices):
    PYTORCH = "pytorch", "PyTorch DDP"
    KVSTORE = "kvstore", "Parameter server (MXNet kvstore style)"


# The roles of each framework, in launch order.
FRAMEWORK_ROLES: dict[str, tuple[str, ...]] = {
    Framework.PYTORCH: ("master", "worker"),
    Framework.KVSTORE: ("scheduler", "server", "worker"),
}
# Roles the platform adds by itself: the user never asks for them and is not charged for them.
PLATFORM_ROLES = ("scheduler",)


class KVStoreMode(models.TextChoices):
    # Shown by MXNet's own names, which is how users know them.
    DIST_SYNC = "dist_sync", "dist_sync"
    DIST_DEVICE_SYNC = "dist_device_sync", "dist_device_sync"
    DIST_ASYNC = "dist_async", "dist_async"


class RestartPolicy(models.TextChoices):
    """What happens when an instance fails: end the job, or stop every instance and start the
    whole group again (torch elastic's way), up to `max_restarts` times."""

    NEVER = "never", "never: a failure ends the job"
    ON_FAILURE = "on-failure", "on failure: restart the whole job"


# The bounds of a restart policy, read by the model, the API schema, the form and the
# submission service alike.
MAX_RESTARTS_LIMIT = 100
RESTART_BACKOFF_DEFAULT_SECONDS = 10
RESTART_BACKOFF_MAX_SECONDS = 3600


def new_checkpoint_key() -> str:
    return secrets.token_hex(8)


# What a job may log unless its image says otherwise (docs/operations.md sizes Redis for them).
DEFAULT_LOG_LINES_PER_SECOND = 2000
DEFAULT_LOG_MAX_MB = 1000
DEFAULT_METRIC_POINTS_PER_SECOND = 500


# An account, QOS, feature expression or reservation as Slurm writes them.
SLURM_WORD = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9_.,&|:()*-]*$",
    "Slurm's own syntax: letters, digits and . _ , & | : ( ) * - only.",
)
SLURM_WORDS = RegexValidator(
    r"^\s*([A-Za-z0-9][A-Za-z0-9_.,&|:()*-]*\s*)*$",
    "Values in Slurm's own syntax (letters, digits and . _ , & | : ( ) * -), separated by spaces.",
)


def allowed_values(what: str, option: str) -> models.CharField:
    """A pool's list of the values a job may choose for one of sbatch's options."""
    return models.CharField(
        max_length=500,
        blank=True,
        validators=[SLURM_WORDS],
        help_text=f"{what} a job may choose ({option}), separated by spaces.",
    )


class SlurmPool(models.Model):
    """A Slurm cluster (one or more partitions of it) jobs can run on instead of Trainyard's own
    agents (docs/slurm.md). The console drives it with Slurm's client commands on its own host:
    it must be a submit host of that cluster (the Slurm client, its slurm.conf, munge's key)."""

    name = models.CharField(max_length=100, unique=True, validators=[validate_name])
    partition = models.CharField(
        max_length=300,
        validators=[
            RegexValidator(
                r"^[A-Za-z0-9][A-Za-z0-9_.-]*(,[A-Za-z0-9][A-Za-z0-9_.-]*)*$",
                "Slurm partitions' names, separated by commas: letters, digits, '.', '_', '-'.",
            )
        ],
        help_text="The partition, or several separated by commas: a job is sent to all of them "
        "(Slurm starts it where it can first) unless it chooses one.",
    )
    shared_root = models.CharField(
        max_length=500,
        help_text="A folder of the shared file system, at the same path on this host and every "
        "node of the partition: jobs' plans, output and checkpoints go there.",
    )
    python = models.CharField(
        max_length=500,
        help_text="An interpreter with Trainyard's workers package, at this path on every node.",
    )
    code_root = models.CharField(
        max_length=500,
        blank=True,
        help_text="Where the nodes see the code root that jobs' script paths are under; empty: "
        "the console's own (TRAINYARD_CODE_ROOT).",
    )
    slurm_conf = models.CharField(
        max_length=500, blank=True, help_text="SLURM_CONF for the client commands; empty: theirs."
    )
    redis_host = models.CharField(
        max_length=255,
        blank=True,
        help_text="How the nodes reach the console's Redis (host or address); empty: as the "
        "console does. Each job's instances get a Redis user of their own, for that job only.",
    )
    # What the site asks every job of the pool to be sent with (sbatch's options of the same
    # names; jobs.services.slurm.slurm_batch.site_options). Never through a shell: argv items.
    account = models.CharField(
        max_length=100, blank=True, validators=[SLURM_WORD], help_text="sbatch --account."
    )
    qos = models.CharField(
        max_length=100, blank=True, validators=[SLURM_WORD], help_text="sbatch --qos."
    )
    constraint = models.CharField(
        max_length=200,
        blank=True,
        validators=[SLURM_WORD],
        help_text="sbatch --constraint: node features, e.g. 'ib&a100'.",
    )
    reservation = models.CharField(
        max_length=100, blank=True, validators=[SLURM_WORD], help_text="sbatch --reservation."
    )
    exclusive = models.BooleanField(
        default=False, help_text="sbatch --exclusive: no other job shares a job's nodes."
    )
    # What a job may choose instead of the pool's own (jobs.services.slurm.slurm_choices):
    # lists separated by spaces, since a constraint may hold commas.
    job_accounts = allowed_values("Accounts", "--account")
    job_qos = allowed_values("QOS", "--qos")
    job_constraints = allowed_values("Constraints", "--constraint")
    job_reservations = allowed_values("Reservations", "--reservation")
    job_exclusive = models.BooleanField(
        default=False, help_text="A job may ask for whole nodes (--exclusive)."
    )
    run_as_owner = models.BooleanField(
        default=False,
        help_text="Each job runs as its owner's Unix account (an admin sets it: Unix accounts), "
        "so that Slurm's accounting, fair share and limits see the person; a user without one "
        "cannot submit here. The console must run sbatch as root (docs/slurm.md).",
    )
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class UnixAccount(models.Model):
    """The Unix account a console user's jobs run as where a pool runs jobs as their owners
    (SlurmPool.run_as_owner), set by an admin: jobs.services.slurm.slurm_identity resolves it
    on the console host and refuses root and system accounts."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, related_name="unix_account", on_delete=models.CASCADE
    )
    username = models.CharField(
        max_length=32,
        validators=[
            RegexValidator(
                r"^[a-z_][a-z0-9_.-]*$",
                "A Unix user name: lower-case letters, digits, '_', '.', '-'.",
            )
        ],
        help_text="The Unix (and Slurm) user the person's jobs run as.",
    )
    slurm_account = models.CharField(
        max_length=100,
        blank=True,
        validators=[SLURM_WORD],
        help_text="sbatch --account for this person's jobs; empty: the pool's.",
    )
    # The numbers, where they are known here: from the directory the person signs in through
    # (posixAccount's uidNumber and gidNumber, the gidNumbers of their posixGroups), or set by
    # an admin. Empty: the console host resolves the username (its passwd, sssd).
    uid = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: looked up.")
    gid = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: looked up.")
    groups = models.JSONField(
        default=list, blank=True, help_text="Supplementary group ids, e.g. [30001, 30002]."
    )
    from_directory = models.BooleanField(
        default=False, editable=False, help_text="Written by the directory at each sign-in."
    )

    def __str__(self) -> str:
        return f"{self.user} as {self.username}"


class DirectoryAccount(models.Model):
    """A console user who signs in through the organisation's LDAP directory
    (jobs/directory.py) or its OpenID Connect provider (jobs/single_sign_on.py): their entry,
    and when it last said they may sign in. Such a user has no password of the console's: the
    directory decides, and (LDAP) a periodic check ends their sessions and tokens once it says
    no more."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, related_name="directory_account", on_delete=models.CASCADE
    )
    dn = models.CharField(
        max_length=500, help_text="Their LDAP entry, or their OpenID Connect subject."
    )
    # How they sign in: the LDAP directory (checked again on a timer) or the organisation's
    # OpenID Connect provider (jobs/single_sign_on.py: checked at each sign-in).
    via = models.CharField(
        max_length=10, choices=[("ldap", "LDAP directory"), ("oidc", "OpenID Connect")],
        default="ldap",
    )  # fmt: skip
    checked = models.DateTimeField(help_text="When the directory last answered for them.")
    refused = models.CharField(
        max_length=300, blank=True, help_text="Why the directory no longer lets them in."
    )

    def __str__(self) -> str:
        return f"{self.user} ({self.dn})"


class FrameworkImage(models.Model):
    """A named runtime for trainers: its framework decides the roles and how they launch."""

    name = models.CharField(max_length=100, unique=True, validators=[validate_name])
    framework = models.CharField(max_length=20, choices=Framework.choices)
    description = models.CharField(max_length=300, blank=True)
    container_image = models.CharField(
        max_length=300,
        blank=True,
        help_text="The OCI image its trainers run in, e.g. registry.example.com/ml/pytorch:2.13; "
        "empty: the host's interpreter (below). Pulled once per node.",
    )
    # Which images of their own users may bring to jobs on this image (its framework decides
    # how they launch): reference prefixes, matched at a boundary (jobs.container_refs).
    user_image_prefixes = models.JSONField(
        "images users may bring",
        default=list,
        blank=True,
        help_text="Prefixes of image references a job on this image may name instead of its "
        'own: ["registry.example.com/team-a/"]. Empty: none; jobs run in this image\'s own.',
    )
    # How its instances run on a host without containers: this interpreter (a virtualenv's or
    # a conda environment's python) instead of the agent's --trainer-python.
    python = models.CharField(
        max_length=500,
        blank=True,
        help_text="The Python its trainers run with on every node, e.g. "
        "/opt/envs/mxnet/bin/python; empty: the agent's --trainer-python.",
    )
    python_per_node = models.JSONField(
        default=dict,
        blank=True,
        help_text='Where a node keeps it elsewhere: {"gpu-7": "/opt/conda/envs/mx/bin/python"}.',
    )
    enabled = models.BooleanField(default=True)
    slurm_pools = models.ManyToManyField(
        SlurmPool, blank=True, related_name="images", help_text="Slurm pools that can run it."
    )
    metric_definitions = models.JSONField(
        default=list,
        blank=True,
        help_text="Metrics read off log lines of every job on this image: "
        '[{"name": "loss", "regex": "loss=([0-9.]+)"}]',
    )
    # Defaults for jobs on this image; a job may set its own.
    restart_policy = models.CharField(
        max_length=20, choices=RestartPolicy.choices, default=RestartPolicy.NEVER
    )
    max_restarts = models.PositiveSmallIntegerField(default=0)
    restart_backoff_seconds = models.PositiveIntegerField(default=RESTART_BACKOFF_DEFAULT_SECONDS)
    health_rules = models.JSONField(
        default=list,
        blank=True,
        help_text="Rules every job on this image starts with (see docs/health-rules.md): "
        '[{"kind": "non-finite", "metric": "loss", "action": "stop"}]',
    )
    default_env = models.JSONField(
        "default variables",
        default=dict,
        blank=True,
        help_text="Environment variables every trainer of a job on this image gets: "
        '{"ACCELERATE_USE_CPU": "true"}. A job\'s own variable of the same name wins. Not '
        "secret: every user sees them on the New job form and in the API.",
    )
    # Ceilings of what a job on this image may log (workers/logquota.py): a job takes these,
    # or lower values of its own. Lines over them are dropped and counted, never silently.
    log_lines_per_second = models.PositiveIntegerField(
        default=DEFAULT_LOG_LINES_PER_SECOND,
        validators=[MinValueValidator(1)],
        help_text="Lines per second each instance of a job may print (a few seconds' burst "
        "more); lines over it are dropped and counted.",
    )
    log_max_mb = models.PositiveIntegerField(
        default=DEFAULT_LOG_MAX_MB,
        validators=[MinValueValidator(1)],
        help_text="Megabytes of log a job may keep in all (shared among its instances); "
        "lines beyond are dropped and counted.",
    )
    metric_points_per_second = models.PositiveIntegerField(
        default=DEFAULT_METRIC_POINTS_PER_SECOND,
        validators=[MinValueValidator(1)],
        help_text="Metric points per second each instance of a job may report.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def roles(self) -> tuple[str, ...]:
        return FRAMEWORK_ROLES[self.framework]

    def python_on(self, node: str) -> str:
        """The interpreter its trainers run with on `node`; empty: the agent's own choice."""
        return str(self.python_per_node.get(node) or self.python)

    def clean(self) -> None:
        """Refuse metric definitions the agent could not use, with the reason, in the admin."""
        from jobs.healthrules import RuleError, parse_rules
        from workers.metricparse import BadMetric, check_definitions

        problems = {}
        try:
            check_definitions(self.metric_definitions)
        except BadMetric as exc:
            problems["metric_definitions"] = str(exc)
        try:
            parse_rules(self.health_rules)
        except RuleError as exc:
            problems["health_rules"] = str(exc)
        if bad_env := env_problems(self.default_env, loader_names_allowed=True):
            problems["default_env"] = " ".join(bad_env)
        paths = (
            [self.python, *self.python_per_node.values()]
            if isinstance(self.python_per_node, dict)
            else [self.python]
        )
        if not isinstance(self.python_per_node, dict) or any(
            not isinstance(p, str) or (p and not p.startswith("/")) for p in paths
        ):
            problems["python"] = "Give absolute paths: /opt/envs/NAME/bin/python."
        prefixes = self.user_image_prefixes
        if not isinstance(prefixes, list):
            problems["user_image_prefixes"] = 'A list of prefixes: ["registry.example.com/a/"].'
        elif bad := [p for p in map(container_refs.prefix_problem, prefixes) if p]:
            problems["user_image_prefixes"] = " ".join(bad)
        if self.container_image and (
            bad_ref := container_refs.reference_problem(self.container_image)
        ):
            problems["container_image"] = bad_ref
        if problems:
            raise ValidationError(problems)


class Package(models.Model):
    """A resource bundle (套餐) one instance runs with, and what it costs per hour."""

    name = models.CharField(max_length=100, unique=True, validators=[validate_name])
    cpu = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    gpus = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=50, blank=True)
    memory_gb = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=4, default=Decimal(0))
    roles = models.JSONField(
        default=list, blank=True, help_text='Roles that may use it, e.g. ["worker"]; empty: any.'
    )
    processes = models.PositiveSmallIntegerField(
        default=0,
        help_text="Processes per instance of a PyTorch job (torchrun's --nproc-per-node); "
        "0: one per GPU, or one without GPUs.",
    )
    max_processes = models.PositiveIntegerField(
        default=4096,
        validators=[MinValueValidator(16)],
        help_text="Processes and threads an instance may hold at once (the kernel counts "
        "threads as tasks: a PyTorch process holds dozens). A fork past it fails.",
    )
    disk_gb = models.FloatField(
        default=0,
        validators=[MinValueValidator(0)],
        help_text="Disk an instance's job may fill on its node (working folder, checkpoints, "
        "instance folders); past it the job is stopped. 0: no limit.",
    )
    enabled = models.BooleanField(default=True)
    slurm_pools = models.ManyToManyField(
        SlurmPool, blank=True, related_name="packages", help_text="Slurm pools that offer it."
    )

    class Meta:
        ordering = ["cpu", "gpus", "memory_gb", "name"]

    def __str__(self) -> str:
        return self.name

    def allows_role(self, role: str) -> bool:
        return not self.roles or role in self.roles

    @property
    def processes_per_instance(self) -> int:
        return self.processes or max(1, self.gpus)

    @property
    def summary(self) -> str:
        gpu = f"{self.gpu_model or 'GPU'} ×{self.gpus}, " if self.gpus else ""
        cores = "1 core" if self.cpu == 1 else f"{self.cpu} cores"
        processes = f", {self.processes} processes" if self.processes > 1 else ""
        return f"{gpu}{cores}, {self.memory_gb} GB{processes}"


class PriorityClass(models.Model):
    """How urgent a job is (issue 25): waiting jobs go in order of `value`, highest first, and a
    job whose class may preempt may evict running jobs of strictly lower value whose class may
    be preempted (jobs.services.scheduler.preemption). A job keeps the value it was admitted with,
    so an admin's later edit reorders no job already submitted; what it may do is read from its
    class when the scheduler decides."""

    # The class a job gets when it names none (created by migration, like low and high).
    DEFAULT_NAME = "normal"

    name = models.CharField(max_length=50, unique=True, validators=[validate_name])
    value = models.IntegerField(help_text="Higher goes first; only strictly higher preempts.")
    may_preempt = models.BooleanField(
        default=False, help_text="Its waiting jobs may evict lower-priority running jobs."
    )
    may_be_preempted = models.BooleanField(
        default=False, help_text="Its running jobs may be evicted by higher-priority ones."
    )
    description = models.CharField(max_length=300, blank=True)
    default_time_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Seconds a job of this class may hold its nodes per attempt, when it sets no "
        "time limit of its own; empty: none (jobs.services.lifecycle.time_limits.default_for).",
    )

    class Meta:
        ordering = ["-value", "name"]
        verbose_name_plural = "priority classes"

    def __str__(self) -> str:
        return self.name


class Quota(models.Model):
    """The most a user, or a group of users together, may hold at once.

    Exactly one of: the default (for users without a quota of their own), one user's, or one
    group's (shared by all its members). A user's effective limit on each resource is the
    tightest of their own (or the default) and those of their groups.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE
    )
    group = models.OneToOneField(Group, null=True, blank=True, on_delete=models.CASCADE)
    is_default = models.BooleanField(default=False)
    cpu = models.PositiveIntegerField()
    gpus = models.PositiveIntegerField()
    memory_gb = models.PositiveIntegerField()
    running_jobs = models.PositiveIntegerField(help_text="Jobs queued or running at once.")
    # A group's quota is its nominal share (issue 25): its members' jobs may also run on
    # capacity other groups leave unused, up to this much more (jobs.services.scheduler.borrowing),
    # and give it back by preemption when a group within its share needs it (reclaim.py).
    borrow_cpu = models.PositiveIntegerField(
        default=0, help_text="Groups: CPU cores it may borrow beyond its quota (0: none)."
    )
    borrow_gpus = models.PositiveIntegerField(
        default=0, help_text="Groups: GPUs it may borrow beyond its quota (0: none)."
    )
    borrow_memory_gb = models.PositiveIntegerField(
        default=0, help_text="Groups: GB of memory it may borrow beyond its quota (0: none)."
    )
    # A group's default time limit for its members' jobs that set none (jobs.services.
    # time_limits.default_for says which default wins); None: no default from this quota.
    default_time_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Seconds a member's job may hold its nodes per attempt, when the job sets "
        "no time limit of its own (groups' quotas); empty: none.",
    )
    max_priority = models.ForeignKey(
        PriorityClass,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The highest priority class its holders may ask for; empty: any.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=Q(is_default=True), name="one_default_quota"
            ),
            models.CheckConstraint(
                condition=Q(is_default=True, user__isnull=True, group__isnull=True)
                | Q(is_default=False, user__isnull=False, group__isnull=True)
                | Q(is_default=False, user__isnull=True, group__isnull=False),
                name="quota_has_one_scope",
                violation_error_message="A quota is the default, a user's or a group's.",
            ),
        ]

    def __str__(self) -> str:
        if self.is_default:
            return "default quota"
        return f"quota of group {self.group}" if self.group_id else f"quota of {self.user}"

    def clean(self) -> None:
        """Only a group borrows: its quota is its nominal share of what the groups share."""
        borrows = self.borrow_cpu or self.borrow_gpus or self.borrow_memory_gb
        if borrows and self.group_id is None:
            raise ValidationError(
                {"borrow_cpu": "Only a group's quota may borrow: leave these at 0 here."}
            )


# What the Nodes page and the waiting reasons call a node that does not sandbox its trainers,
# where the console runs jobs only on nodes that do (TRAINYARD_ALLOW_UNISOLATED_NODES).
NOT_ISOLATED = "not isolated"
# The same for a node that cannot hold its instances to their packages (workers/cgroups.py).
LIMITS_NOT_ENFORCED = "limits not enforced"
DISK_FULL = "disk full"
AGENT_TOO_OLD = "agent too old"


def current_protocol() -> int:
    """A callable default, so that a new protocol version needs no migration."""
    return contract.PROTOCOL_VERSION


# The Isolation values that hold trainers apart, as strings (a set lookup: a scheduling pass asks
# for a thousand nodes).
_ISOLATING = frozenset(i.value for i in Isolation if i.isolated)
_ENFORCING = frozenset(layout.value for layout in Layout if layout is not Layout.NONE)


class Node(models.Model):
    """A machine with a node agent.

    `reported_*` is what the agent found on the host; `cpu`, `gpus` and `memory_gb` are what
    placement uses: the reported values, unless an admin set them (then heartbeats leave them).
    Lost is not stored: a node is lost while its heartbeats are older than the stale limit.
    """

    class State(models.TextChoices):
        READY = "ready"
        DRAINING = "draining", "draining (no new work)"

    name = models.CharField(max_length=100, unique=True, validators=[validate_name])
    address = models.CharField(max_length=255)
    cpu = models.PositiveIntegerField(help_text="Advertised CPU cores.")
    gpus = models.PositiveIntegerField(default=0, help_text="Advertised GPUs.")
    gpu_model = models.CharField(max_length=50, blank=True)
    memory_gb = models.PositiveIntegerField(help_text="Advertised memory.")
    capacity_set_by_admin = models.BooleanField(
        default=False, help_text="Keep the advertised capacity instead of what the agent reports."
    )
    reported_cpu = models.PositiveIntegerField(default=0)
    reported_gpus = models.PositiveIntegerField(default=0)
    reported_memory_gb = models.PositiveIntegerField(default=0)
    labels = models.JSONField(default=dict, blank=True, help_text='e.g. {"zone": "a"}')
    state = models.CharField(max_length=20, choices=State.choices, default=State.READY)
    running = models.JSONField(
        default=list, blank=True, help_text="What the agent said it runs, at its last heartbeat."
    )
    finished = models.JSONField(
        default=list,
        blank=True,
        help_text="How replicas ended there lately, as the agent said at its last heartbeat.",
    )
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    # How the node's trainers are held apart (workers/sandbox.py), as its agent says: sandbox,
    # sandbox-shared-uid, none; empty from an agent older than the sandbox (not isolated).
    isolation = models.CharField(max_length=30, blank=True, default="")
    isolation_reason = models.CharField(max_length=300, blank=True, default="")
    # How the node holds instances to their packages (workers/cgroups.py), as its agent says:
    # cgroup-v1, cgroup-v2, none; empty from an agent older than limits (not enforced).
    limits = models.CharField(max_length=30, blank=True, default="")
    limits_reason = models.CharField(max_length=300, blank=True, default="")
    # Which run of the agent process is talking: a new value means the agent started again and
    # knows nothing of what its previous incarnation ran.
    incarnation = models.CharField(max_length=64, blank=True)
    incarnation_since = models.DateTimeField(null=True, blank=True)
    previous_heartbeat = models.DateTimeField(
        null=True, blank=True, help_text="The last heartbeat of the agent's previous incarnation."
    )
    # When the agent sent the heartbeat applied last (its own clock): heartbeats are handled by
    # several console threads, and an older one arriving late must not undo a newer one.
    heartbeat_sent = models.FloatField(default=0.0)
    # The agent protocol its agent speaks (workers/contract.PROTOCOL_VERSION), as its last
    # heartbeat said: 0 from an agent older than versioning. Below MIN_AGENT_PROTOCOL the node
    # gets no new work. A node an admin adds is taken to speak this console's until it is heard.
    protocol = models.PositiveIntegerField(default=current_protocol)
    # Why its agent's work disk is full ("node-2: no space left on ..."), as its last heartbeat
    # said; empty while there is room.
    disk_full = models.CharField(max_length=300, blank=True, default="")
    registered = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def is_lost(self, now: "datetime | None" = None) -> bool:
        return Node.lost_since(self.last_heartbeat, now or timezone.now())

    @staticmethod
    def lost_since(last_heartbeat: "datetime | None", now: "datetime") -> bool:
        if last_heartbeat is None:
            return True
        return (now - last_heartbeat).total_seconds() > settings.TRAINYARD_NODE_STALE_SECONDS

    @property
    def isolated(self) -> bool:
        """Whether its trainers run sandboxed, each seeing nothing but its own job."""
        return Node.isolates(self.isolation)

    @staticmethod
    def isolates(isolation: str) -> bool:
        # Empty (an agent older than the sandbox) or unknown: not isolated.
        return isolation in _ISOLATING

    @property
    def limits_enforced(self) -> bool:
        """Whether each instance there is held to its package (a cgroup per instance)."""
        return Node.enforces(self.limits)

    @staticmethod
    def enforces(limits: str) -> bool:
        # Empty (an agent older than limits) or unknown: not enforced.
        return limits in _ENFORCING

    @property
    def status(self) -> str:
        """ready, draining, lost, "agent too old" (its protocol is below what this console
        needs), "disk full", or "not isolated" where this console runs jobs only on nodes that
        sandbox their trainers: what the node page shows. Only a ready node gets new work."""
        return Node.status_of(
            self.state,
            self.last_heartbeat,
            self.protocol,
            self.disk_full,
            self.isolation,
            limits=self.limits,
        )

    @staticmethod
    def status_of(
        state: str,
        last_heartbeat: "datetime | None",
        protocol: int,
        disk_full: str,
        isolation: str,
        now: "datetime | None" = None,
        limits: str = "",
    ) -> str:
        """`status` from the node's fields as plain values (a scheduling pass reads a thousand
        nodes so, not as model instances)."""
        if Node.lost_since(last_heartbeat, now or timezone.now()):
            return "lost"
        if protocol < contract.MIN_AGENT_PROTOCOL:
            return AGENT_TOO_OLD
        if disk_full:
            return DISK_FULL
        if not settings.TRAINYARD_ALLOW_UNISOLATED_NODES:
            if not Node.isolates(isolation):
                return NOT_ISOLATED
            if not Node.enforces(limits):
                return LIMITS_NOT_ENFORCED
        return state

    @property
    def status_reason(self) -> str:
        """Why it takes no new work, where its status alone does not say: what a waiting job's
        reason and the node page quote."""
        status = self.status
        if status == AGENT_TOO_OLD:
            return (
                f"{self.name}: its agent speaks protocol {self.protocol}, this console needs "
                f"{contract.MIN_AGENT_PROTOCOL} or later: upgrade the agent"
            )
        if status == DISK_FULL:
            return self.disk_full
        if status == LIMITS_NOT_ENFORCED:
            return f"{self.name}: limits not enforced: {self.limits_reason or 'agent too old'}"
        return ""


class AgentCredential(models.Model):
    """A node agent's credentials (workers/credentials.py), by node name: the node may not have
    registered yet. Only what the console needs is kept: the SHA-256 of the agent's secret (the
    `#<hash>` form of its Redis ACL user's password, so the user can be re-created after Redis
    restarts) and the key that checks its reports' signatures. The secret itself is printed
    once, inside the agent's REDIS_URL, and kept nowhere here."""

    node_name = models.CharField(max_length=63, unique=True)
    password_sha256 = models.CharField(max_length=64)
    signing_key = models.CharField(max_length=64)
    created = models.DateTimeField(auto_now_add=True)
    rotated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node_name"]

    def __str__(self) -> str:
        return f"credentials of {self.node_name}"


class CodeSnapshot(models.Model):
    """A project folder as a canonical .tar.gz, named by its SHA-256 (workers/snapshot.py).
    Stored once however many users upload it; a job keeps the one it was submitted with."""

    sha256 = models.CharField(max_length=64, unique=True)
    archive = models.BinaryField()
    size = models.PositiveBigIntegerField(help_text="Bytes of the archive.")
    unpacked_size = models.PositiveBigIntegerField(help_text="Bytes of its files.")
    files = models.JSONField(default=list, help_text="Paths of its files, sorted.")
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.sha256[:12]


class CodeUpload(models.Model):
    """That a user uploaded a snapshot (and may run it), under a name of theirs."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    snapshot = models.ForeignKey(CodeSnapshot, on_delete=models.PROTECT, related_name="uploads")
    name = models.CharField(max_length=200, blank=True, validators=[validate_name])
    uploaded = models.DateTimeField(default=timezone.now, help_text="The latest upload of it.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "snapshot"], name="one_upload_per_owner")
        ]
        ordering = ["-uploaded"]

    def __str__(self) -> str:
        return f"{self.name or self.snapshot} ({self.owner})"


def batch_size_in(args: list[str]) -> int | None:
    """The `--batch-size N` (or `--batch-size=N`) among a program's arguments, if any: by the
    examples' convention, the batch of each machine, not the global one."""
    for i, arg in enumerate(args):
        value = None
        if arg == "--batch-size" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--batch-size="):
            value = arg.split("=", 1)[1]
        if value is not None and value.isdigit():
            return int(value)
    return None


class Job(models.Model):
    class State(models.TextChoices):
        """A job's state. Allowed transitions (`Job.TRANSITIONS`):

        pending -> queued             admitted: its replicas wait for room on the nodes
        queued  -> running            every replica of the current attempt has started
        queued | running -> succeeded every replica of the current attempt exited 0
        queued | running -> restarting   an instance failed (or a health rule, or an eviction,
                                      asked for a restart) and the restart policy allows one:
                                      every instance is stopped, a new attempt waits
        restarting -> queued          the old attempt's processes are gone and the back-off has
                                      passed: the new attempt waits for room on the nodes
        restarting -> succeeded       the old attempt's instances had all exited 0 on their
                                      own before their stop arrived: the job had finished
        pending | queued | running | restarting -> failed     an instance failed and no restart
                                      is left, or a health rule stopped it
        pending | queued | running | restarting -> cancelled  a user cancelled it

        succeeded, failed and cancelled are final. A restarting job keeps its quota.
        """

        PENDING = "pending"
        QUEUED = "queued"
        RUNNING = "running"
        RESTARTING = "restarting"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ACTIVE_STATES = (State.PENDING, State.QUEUED, State.RUNNING, State.RESTARTING)
    TERMINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED)
    # Waiting for room: no process has started yet, so there is no log either.
    WAITING_STATES = (State.PENDING, State.QUEUED)
    TRANSITIONS: dict[str, frozenset[str]] = {
        State.PENDING: frozenset({State.QUEUED, State.FAILED, State.CANCELLED}),
        State.QUEUED: frozenset(
            {State.RUNNING, State.SUCCEEDED, State.RESTARTING, State.FAILED, State.CANCELLED}
        ),
        State.RUNNING: frozenset(
            {State.SUCCEEDED, State.RESTARTING, State.FAILED, State.CANCELLED}
        ),
        State.RESTARTING: frozenset({State.QUEUED, State.SUCCEEDED, State.FAILED, State.CANCELLED}),
        State.SUCCEEDED: frozenset(),
        State.FAILED: frozenset(),
        State.CANCELLED: frozenset(),
    }

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=200, validators=[validate_name])
    image = models.ForeignKey(FrameworkImage, on_delete=models.PROTECT)
    # The OCI image its trainers run in, fixed at submission (the image's own, or one the
    # owner brought within its allow-list); empty: the host's interpreter. An admin who
    # moves an image to a new tag changes the jobs submitted after, never one already queued.
    container_image = models.CharField(max_length=300, blank=True)
    # Where it runs: a Slurm pool, or (None) Trainyard's own agents.
    slurm_pool = models.ForeignKey(SlurmPool, null=True, blank=True, on_delete=models.PROTECT)
    # Its own Slurm options, within what the pool allows (slurm_choices.SlurmChoices.stored):
    # {"qos": "high", "partition": "gpu-long", ...}; {}: the pool's.
    slurm_options = models.JSONField(default=dict, blank=True)
    program = models.JSONField(
        help_text='{"example": NAME}, {"path": RELATIVE_PATH} under the code root, or '
        '{"path": RELATIVE_PATH, "snapshot": SHA256} inside a code snapshot'
    )
    # The code snapshot the job runs (also in `program`, for the agents): kept while it is.
    snapshot = models.ForeignKey(
        CodeSnapshot, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    args = models.JSONField(default=list)
    env = models.JSONField(
        default=dict, blank=True, help_text="The job's own environment variables {NAME: value}."
    )
    # Frozen at submission, as the totals are: an admin's later change to the image's defaults
    # reaches the next job (a rerun included), never one already submitted or restarting.
    image_env = models.JSONField(
        default=dict,
        blank=True,
        help_text="The image's default variables when the job was submitted; its own win.",
    )
    kvstore = models.CharField(
        max_length=20, choices=KVStoreMode.choices, blank=True, help_text="Parameter-server jobs."
    )
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    # Totals by the quota formula (CPU_total = Σ package.cpu × instances), frozen at submission
    # so that later catalog edits cannot change them.
    cpu_total = models.PositiveIntegerField()
    gpus_total = models.PositiveIntegerField()
    memory_gb_total = models.PositiveIntegerField()
    price_per_hour = models.DecimalField(max_digits=12, decimal_places=4)
    reason = models.TextField(blank=True, help_text="Why the job waits, failed or was cancelled.")
    metric_definitions = models.JSONField(
        default=list, blank=True, help_text="Regex metrics of this job, beside the image's."
    )
    baseline = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="An earlier job this one is compared with (curves, speedup, samples per dollar).",
    )
    restart_policy = models.CharField(
        max_length=20, choices=RestartPolicy.choices, default=RestartPolicy.NEVER
    )
    max_restarts = models.PositiveSmallIntegerField(default=0)
    restart_backoff_seconds = models.PositiveIntegerField(default=RESTART_BACKOFF_DEFAULT_SECONDS)
    exclude_failed_node = models.BooleanField(
        default=False, help_text="Restart away from the node where the failure happened."
    )
    # What every attempt after the first runs with on top of `args` (jobs.services.resume_args):
    # nanoGPT, for one, resumes only when told `--init_from=resume`.
    args_on_resume = models.JSONField(
        default=list,
        blank=True,
        help_text="Arguments that later attempts add, or put in place of the same option.",
    )
    one_instance_per_node = models.BooleanField(
        default=False,
        help_text="No two instances of the job on one node (Slurm's --ntasks-per-node=1).",
    )
    # The owner's own Unix identity, as the console resolved it at submission
    # (jobs.services.identity.unix_identity_of), which every attempt runs as, so that what an
    # attempt wrote is the next one's. Empty: none was known; nodes give a uid of Trainyard's.
    run_uid = models.PositiveIntegerField(null=True, blank=True)
    run_gid = models.PositiveIntegerField(null=True, blank=True)
    run_groups = models.JSONField(default=list, blank=True)
    # Folders of the nodes' file system the job named (workers/folderaccess.py): data its
    # trainers read, and the folder its results go to.
    data_folders = models.JSONField(default=list, blank=True)
    results_folder = models.CharField(max_length=4096, blank=True, default="")
    health_rules = models.JSONField(default=list, blank=True)
    # Frozen at submission (the job's own, or the default then:
    # jobs.services.lifecycle.time_limits).
    time_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Seconds each attempt may hold its nodes, counted from its placement; then "
        "it is stopped and the job fails. Empty: no limit.",
    )
    # The current attempt (0: the first run); replicas of earlier attempts keep their rows.
    attempt = models.PositiveIntegerField(default=0)
    # An elastic job (its worker role asked for as {min, max}) runs with any number of charged
    # instances from min_size to max_size; a fixed one has both equal to its instances.
    # `resizes` counts the attempts begun to change its size (grow, shrink): neither failures
    # nor restarts of its policy (jobs.services.lifecycle.elastic).
    min_size = models.PositiveIntegerField(default=0)
    max_size = models.PositiveIntegerField(default=0)
    resizes = models.PositiveIntegerField(default=0)
    restarts_used = models.PositiveSmallIntegerField(
        default=0, help_text="Restarts counted against max_restarts (evictions are not)."
    )
    restart_at = models.DateTimeField(
        null=True, blank=True, help_text="A restarting job's next attempt waits until then."
    )
    excluded_nodes = models.JSONField(
        default=list, blank=True, help_text="Nodes this job's attempts no longer go to."
    )
    # Names the job's checkpoint folder on the shared root together with its id, so that a job
    # id used again (a fresh database) never resumes another job's checkpoints.
    checkpoint_key = models.CharField(max_length=32, default=new_checkpoint_key)
    # Fair share with borrowing (jobs.services.scheduler.borrowing, reclaim): whether its current
    # attempt was placed beyond its group's nominal share (on capacity other groups left unused, so
    # it is the first given back), and the waiting job of a lending group its last attempt was
    # stopped for (that job's room stays reserved for it until it starts).
    borrowed = models.BooleanField(default=False)
    reclaimed_for = models.PositiveIntegerField(null=True, blank=True, db_index=True)
    # Its priority class, and the class's value when it was admitted (the queue orders by the
    # value; an admin's later edit of the class does not reorder jobs already submitted).
    priority_class = models.ForeignKey(
        PriorityClass, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    priority = models.IntegerField(default=0)
    # Preemption history (jobs.services.scheduler.preemption): the ids of the jobs that preempted
    # it, in order. A job never preempts one that preempted it, and a job preempted once is not
    # preempted again before TRAINYARD_PREEMPTION_MIN_RUN_SECONDS. Which attempt each ended
    # is on the attempt (JobAttempt.preempted_by).
    preempted_by = models.JSONField(default=list, blank=True)
    # While it waits at the head of the queue: the start the scheduler reserved for it from
    # the running jobs' time limits (jobs.services.scheduler.backfill); null otherwise.
    estimated_start = models.DateTimeField(null=True, blank=True, db_index=True)
    log_complete = models.BooleanField(default=False)
    # Every line, and the end marker, is in LogChunk: the log no longer needs Redis.
    log_archived = models.BooleanField(default=False)
    # The job's log limits: its image's, or lower ones the user asked for (see FrameworkImage).
    log_lines_per_second = models.PositiveIntegerField(default=DEFAULT_LOG_LINES_PER_SECOND)
    log_max_mb = models.PositiveIntegerField(default=DEFAULT_LOG_MAX_MB)
    metric_points_per_second = models.PositiveIntegerField(default=DEFAULT_METRIC_POINTS_PER_SECOND)
    # Lines and metric points dropped so far for going over those limits: the log keeper adds
    # up the agents' markers (and its own drops) as it archives them, once each.
    log_dropped_lines = models.PositiveBigIntegerField(default=0)
    log_dropped_points = models.PositiveBigIntegerField(default=0)
    # Retention (jobs.services.retention): a kept job's log and metrics stay however old it is;
    # otherwise they go `log_retention_days` after it ended (None: TRAINYARD_LOG_RETENTION_DAYS;
    # 0: never). `logs_pruned` says when they went, so pages can say why a log is empty.
    keep = models.BooleanField(
        default=False, help_text="Keep its log and metrics however old it is (retention)."
    )
    log_retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Days its log and metrics are kept after it ends; empty: the console's "
        "default; 0: forever.",
    )
    logs_pruned = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    # What its owner files it under (jobs.labels; written by jobs.services.run_labels): a
    # project groups runs, tags label them (JobTag), a note says what the run was for.
    project = models.CharField(
        max_length=PROJECT_MAX, blank=True, default="", validators=[validate_project]
    )
    note = models.TextField(max_length=NOTE_MAX, blank=True, default="", validators=[validate_note])
    # Its arguments and variables as key/values (jobs.runconfig), written at submission: the
    # run table sorts and shows them as columns without parsing every job's arguments.
    config = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [
            models.Index(fields=["owner", "state"]),
            models.Index(fields=["state"]),
            # The job list's default order (newest first), for everyone's jobs and for one
            # user's: a page is read off the index instead of sorting every job.
            models.Index(fields=["created", "id"], name="job_created_id"),
            models.Index(fields=["owner", "created", "id"], name="job_owner_created_id"),
            # The queue's order (jobs.services.scheduler.queue_order).
            models.Index(fields=["state", "-priority", "created", "id"], name="job_queue_order"),
            # The run table filtered by project (a project's runs, newest first).
            models.Index(fields=["project", "created", "id"], name="job_project_created_id"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name}"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE_STATES

    @property
    def priority_name(self) -> str:
        pclass = self.priority_class if self.priority_class_id else None
        return pclass.name if pclass is not None else PriorityClass.DEFAULT_NAME

    def args_of_attempt(self, number: int) -> list[str]:
        """The arguments attempt `number` runs with: the first, `args`; every later one (a
        restart, a resume after preemption or a lost node), `args_on_resume` in place."""
        if number == 0 or not self.args_on_resume:
            return list(self.args)
        return merge(list(self.args), list(self.args_on_resume))

    @property
    def is_elastic(self) -> bool:
        return self.min_size < self.max_size

    @property
    def restarts_left(self) -> int:
        if self.restart_policy != RestartPolicy.ON_FAILURE:
            return 0
        return max(0, self.max_restarts - self.restarts_used)

    @property
    def per_worker_batch(self) -> int | None:
        """The --batch-size the program was given, if it was: the batch of each machine."""
        return batch_size_in(self.args)

    @property
    def slurm_job_ids(self) -> list[str]:
        """Each attempt's Slurm job, in order (the job page's summary)."""
        return [
            a.slurm_job_id for a in sorted(self.attempts.all(), key=lambda a: a.number)
            if a.slurm_job_id
        ]  # fmt: skip

    @property
    def slurm_option_flags(self) -> list[str]:
        """Its own Slurm options besides the partition, as sbatch gets them (the job page)."""
        return [
            f"--{option}" if value is True else f"--{option}={value}"
            for option, value in self.slurm_options.items()
            if option != "partition" and value not in ("", None, False)
        ]

    def env_seen_by(self, viewer: object) -> dict[str, str]:
        """Its environment as `viewer` may see it: every value for its owner; for anyone else
        (an admin), the values of secret-looking names masked."""
        return (
            dict(self.env) if getattr(viewer, "pk", None) == self.owner_id else masked_env(self.env)
        )

    @property
    def script(self) -> str:
        """What the user picked: a built-in example's name or a path under the code root."""
        return str(self.program.get("example") or self.program.get("path") or "")


class JobRole(models.Model):
    """What the user asked for one role: a package and an instance count."""

    job = models.ForeignKey(Job, related_name="roles", on_delete=models.CASCADE)
    role = models.CharField(max_length=20)
    package = models.ForeignKey(Package, on_delete=models.PROTECT)
    instances = models.PositiveIntegerField(help_text="Elastic: the most it runs with.")
    min_instances = models.PositiveIntegerField(
        null=True, blank=True, help_text="Elastic: the fewest it runs with. Empty: fixed."
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "role"], name="one_row_per_role")]

    def __str__(self) -> str:
        if self.min_instances is not None:
            return f"{self.role} {self.package} ×{self.min_instances}-{self.instances}"
        return f"{self.role} {self.package} ×{self.instances}"

    @property
    def count_text(self) -> str:
        """ "3", or an elastic role's "1-3 (elastic)"."""
        if self.min_instances is None:
            return str(self.instances)
        return f"{self.min_instances}-{self.instances} (elastic)"

    @property
    def asked(self) -> "int | dict[str, int]":
        """What the request said: a number, or an elastic role's {"min": N, "max": M}."""
        if self.min_instances is None:
            return self.instances
        return {"min": self.min_instances, "max": self.instances}


class JobAttempt(models.Model):
    """One run of the whole job: the first, and one per restart, with why it ended."""

    job = models.ForeignKey(Job, related_name="attempts", on_delete=models.CASCADE)
    number = models.PositiveIntegerField(help_text="0 for the first run, then 1, 2, ...")
    created = models.DateTimeField(auto_now_add=True)
    # When the scheduler gave it its nodes: its time limit counts from here, as Slurm's
    # counts from the allocation, since it holds the nodes from then on.
    placed = models.DateTimeField(null=True, blank=True)
    # When it joined the queue (at submission; after its restart's back-off): the head of the
    # queue has waited since then, not since the job was submitted
    # (jobs.services.scheduler.scheduling).
    queued = models.DateTimeField(null=True, blank=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    nodes = models.JSONField(default=list, blank=True)
    reason = models.TextField(blank=True, help_text="Why it ended, when not by succeeding.")
    # The charged instances it was placed with, and, for an elastic job, why that differs
    # from the attempt before ("grew to 4: room freed on node-1"): its size over time.
    instances = models.PositiveIntegerField(null=True, blank=True)
    resize = models.CharField(max_length=300, blank=True, default="")
    # False while an elastic attempt that an instance's failure ended waits for the rest of
    # its instances to end: only then is it known whether a node was behind it (a shrink) or
    # the job itself (a restart of its policy, or its end) (jobs.services.lifecycle.elastic).
    judged = models.BooleanField(default=True)
    # A Slurm pool's job: Slurm's id of the job this attempt is (empty until submitted), and
    # the SHA-256 of its Redis user's secret, so that the user can be made again after Redis
    # restarts without it (jobs/services/slurm/slurm_access.py); the secret itself is not kept.
    slurm_job_id = models.CharField(max_length=50, blank=True)
    slurm_redis_hash = models.CharField(max_length=64, blank=True)
    # Set, and committed, before a pass runs sbatch for this attempt outside any transaction;
    # cleared with slurm_job_id's write. While set, no other pass submits the attempt, and no
    # pass cancels the Slurm job it becomes (jobs/services/slurm/slurm_pass.py).
    slurm_submitting = models.DateTimeField(null=True, blank=True)
    # While it waits in Slurm's queue: its place among the pending jobs of its partition, as
    # the last pass saw it (1: Slurm's scheduler takes it next); None otherwise.
    slurm_place = models.PositiveIntegerField(null=True, blank=True)
    # Once its Slurm job ended, what Slurm's accounting (sacct) recorded of it, where the
    # cluster keeps one: state, exit code, start, end, the peak memory of its steps.
    slurm_accounting = models.JSONField(default=dict, blank=True)
    counted = models.BooleanField(
        default=True, help_text="Whether its end used up a restart (an eviction does not)."
    )
    # The job whose preemption ended it: while its instances stop, their room is that job's
    # (jobs.services.scheduler.preempt_pass), and only then; an attempt that ended otherwise has
    # none.
    preempted_by = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The job whose preemption ended this attempt."
    )

    class Meta:
        ordering = ["job_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="one_row_per_attempt")
        ]
        indexes = [
            # Fair share reads, every scheduling pass, the attempts that started and have not
            # ended or ended lately (jobs.services.scheduler.fairshare.usage_by_user): without it
            # the pass walked every job of the history for a thousand running ones (issue 24).
            models.Index(
                fields=["finished"],
                condition=models.Q(started__isnull=False),
                name="attempt_started_finished",
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number + 1} of job {self.job_id}"


class HealthEvent(models.Model):
    """A health rule that fired on a job, with what it measured and what was done."""

    job = models.ForeignKey(Job, related_name="health_events", on_delete=models.CASCADE)
    attempt = models.PositiveIntegerField()
    at = models.DateTimeField(auto_now_add=True)
    rule = models.CharField(max_length=200)
    action = models.CharField(max_length=30)
    role = models.CharField(max_length=20)
    index = models.IntegerField(default=0)
    node = models.CharField(max_length=100, blank=True)
    # The measured value: a number, or "nan" / "inf" / "-inf" (JSON and SQLite have no NaN).
    value = models.JSONField(null=True, blank=True)
    message = models.TextField()
    outcome = models.TextField(blank=True, help_text="What the console did about it.")

    class Meta:
        ordering = ["job_id", "at", "id"]

    def __str__(self) -> str:
        return f"{self.rule} on job {self.job_id}"


class Replica(models.Model):
    """One running copy of a role in one attempt: what node it is on and how it ended."""

    class State(models.TextChoices):
        """A replica's state. Allowed transitions (`Replica.TRANSITIONS`):

        pending  -> assigned           placed on a node; its start message is sent
        assigned -> running            its agent reported the processes started
        assigned | running -> succeeded | failed | stopped   it ended, as its agent reported,
                                       or as reconciliation found (node lost, agent forgot it)
        pending  -> stopped            the job ended before it was placed

        succeeded, failed and stopped are final. assigned and running hold node capacity.
        """

        PENDING = "pending"  # not placed yet
        ASSIGNED = "assigned"  # placed and sent to its node's agent
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        STOPPED = "stopped"  # stopped by the platform (cancel, or another replica failed)

    HOLDING_STATES = (State.ASSIGNED, State.RUNNING)
    FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.STOPPED)
    TRANSITIONS: dict[str, frozenset[str]] = {
        State.PENDING: frozenset({State.ASSIGNED, State.STOPPED}),
        State.ASSIGNED: frozenset({State.RUNNING, State.SUCCEEDED, State.FAILED, State.STOPPED}),
        State.RUNNING: frozenset({State.SUCCEEDED, State.FAILED, State.STOPPED}),
        State.SUCCEEDED: frozenset(),
        State.FAILED: frozenset(),
        State.STOPPED: frozenset(),
    }

    job = models.ForeignKey(Job, related_name="replicas", on_delete=models.CASCADE)
    attempt = models.PositiveIntegerField(default=0)
    role = models.CharField(max_length=20)
    index = models.PositiveIntegerField()
    # None for the platform's own roles (the scheduler): they hold no package and no capacity.
    package = models.ForeignKey(Package, null=True, blank=True, on_delete=models.PROTECT)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.PROTECT)
    # A Slurm pool's replica: the Slurm node it runs on (it has no Node of Trainyard's).
    slurm_node = models.CharField(max_length=100, blank=True)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    exit_code = models.IntegerField(null=True, blank=True)
    reason = models.TextField(blank=True, help_text="How it ended, when not with exit code 0.")
    # When what ended it happened (the process's exit, the node's last heartbeat): the job's
    # reason is the earliest failure, not the first report to arrive.
    cause_at = models.DateTimeField(null=True, blank=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    # What it used, from its cgroup's counters on the node (workers/cgroups.py), as its agent
    # said when it ended; None where the node enforces no limits (or it has not ended).
    cpu_seconds = models.FloatField(null=True, blank=True)
    memory_peak_bytes = models.BigIntegerField(null=True, blank=True)
    # Messages to the agent, so that reconciliation can send again what was never acknowledged.
    start_sent = models.DateTimeField(null=True, blank=True)
    starts_sent = models.PositiveSmallIntegerField(default=0)
    stop_sent = models.DateTimeField(null=True, blank=True)
    incarnation = models.CharField(
        max_length=64, blank=True, help_text="The agent process that reported it started."
    )

    class Meta:
        ordering = ["job_id", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "role", "index"], name="one_replica_per_slot"
            )
        ]
        indexes = [
            # The waiting jobs (those with a replica still pending) and what holds each node
            # are read by state on every scheduling pass: without it, a pass read every
            # replica of the history (issue 24).
            models.Index(fields=["state", "job"], name="replica_state_job"),
        ]

    def __str__(self) -> str:
        return f"{self.tag} of job {self.job_id}"

    @property
    def tag(self) -> str:
        return tag_of(self.role, self.index)


class LogChunk(models.Model):
    """Consecutive lines of one process's stdout or stderr, archived from the job's Redis Stream.

    Chunks of a job cover its cursors without holes: a range of lines that was gone from Redis
    before it could be archived is a GAP chunk, so readers can say so instead of skipping it.
    """

    class Kind(models.TextChoices):
        LINES = "lines"
        GAP = "gap"
        END = "end"

    job = models.ForeignKey(Job, related_name="log_chunks", on_delete=models.CASCADE)
    first_cursor = models.BigIntegerField()
    last_cursor = models.BigIntegerField()
    kind = models.CharField(max_length=5, choices=Kind.choices, default=Kind.LINES)
    role = models.CharField(max_length=20, blank=True)
    index = models.IntegerField(default=0)
    attempt = models.PositiveIntegerField(default=0)
    node = models.CharField(max_length=100, blank=True)
    stream = models.CharField(max_length=6, blank=True, help_text="stdout or stderr")
    ts = models.FloatField(default=0.0, help_text="When the agent read the first line.")
    text = models.TextField(
        blank=True, help_text="The lines joined by newlines; for END, why the log ended."
    )
    # A marker's chunk (workers/logquota.py), or the log keeper's own drops: lines and metric
    # points over the job's limits that this chunk accounts for (Job.log_dropped_* add them up).
    dropped_lines = models.PositiveBigIntegerField(default=0)
    dropped_points = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            # Also the index every read goes through: a job's chunks in cursor order.
            models.UniqueConstraint(fields=["job", "last_cursor"], name="one_chunk_per_cursor")
        ]

    def __str__(self) -> str:
        return f"log {self.first_cursor}-{self.last_cursor} of job {self.job_id}"


class LogAck(models.Model):
    """How far the database has a job's lines from one writer (an agent's file, by the offset its
    lines end at; or an agent's own numbered batches): the log keeper's acknowledgement.

    Written with the chunks it covers, in one transaction. Agents keep a file's lines until its
    acknowledgement passes them, and after Redis lost writes they send again from there; the
    keeper keeps each (writer, sequence number) once.
    """

    job = models.ForeignKey(Job, related_name="log_acks", on_delete=models.CASCADE)
    writer = models.CharField(max_length=100)
    seq = models.BigIntegerField()  # -1: none of its lines yet
    # Where the writer's lines end, once its replica has ended (its agent's exit report): the
    # keeper closes the job's log only when `seq` has reached it.
    goal = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "writer"], name="one_ack_per_writer")]

    def __str__(self) -> str:
        return f"{self.writer} of job {self.job_id} archived to {self.seq}"


class MetricPoint(models.Model):
    """One metric value a job's process reported (or its agent sampled), archived for charts,
    figures and export. `cursor` is its place in the job's log stream, which carries points too."""

    job = models.ForeignKey(Job, related_name="metric_points", on_delete=models.CASCADE)
    cursor = models.BigIntegerField()
    role = models.CharField(max_length=20)
    index = models.IntegerField()
    node = models.CharField(max_length=100, blank=True)
    name = models.CharField(max_length=64)
    value = models.FloatField()
    step = models.BigIntegerField(null=True, blank=True)
    epoch = models.FloatField(null=True, blank=True)
    ts = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "cursor"], name="one_point_per_cursor")
        ]
        indexes = [models.Index(fields=["job", "name", "cursor"])]

    def __str__(self) -> str:
        return f"{self.name}={self.value} of job {self.job_id}"


class JobTag(models.Model):
    """A label its owner gave a job (jobs.labels): the run table filters by it (`?tag=`)."""

    job = models.ForeignKey(Job, related_name="tags", on_delete=models.CASCADE)
    label = models.CharField(max_length=TAG_MAX, validators=[validate_tag])

    class Meta:
        ordering = ["label"]
        constraints = [models.UniqueConstraint(fields=["job", "label"], name="one_tag_per_label")]
        # The jobs with a tag, for the filter.
        indexes = [models.Index(fields=["label", "job"], name="jobtag_label_job")]

    def __str__(self) -> str:
        return f"{self.label} on job {self.job_id}"


class MetricSummary(models.Model):
    """The final and extreme values of one of a job's metrics, kept up to date by the log
    keeper as it archives points (jobs.services.metric_summaries), so that the run table sorts
    by "best eval_accuracy" in one query instead of reading every job's points.

    `final` is the mean of the reports at the last step, as figures.final_value reads it;
    `through_cursor` is the last point folded in, so that a batch archived twice counts once."""

    job = models.ForeignKey(Job, related_name="metric_summaries", on_delete=models.CASCADE)
    name = models.CharField(max_length=64)
    final = models.FloatField()
    final_step = models.BigIntegerField(default=0)
    final_sum = models.FloatField(default=0.0)
    final_count = models.PositiveIntegerField(default=0)
    minimum = models.FloatField()
    maximum = models.FloatField()
    points = models.PositiveBigIntegerField(default=0)
    through_cursor = models.BigIntegerField(default=-1)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "name"], name="one_summary_per_metric")
        ]
        verbose_name_plural = "metric summaries"

    def __str__(self) -> str:
        return f"{self.name} of job {self.job_id}: final {self.final}"


class RunTableView(models.Model):
    """A way of looking at the job list that a user keeps: its query string (filters, sort,
    columns). Named views are restored in one click; the one with no name is the last used,
    whose columns and sort the list takes when it is opened without any."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, related_name="run_table_views", on_delete=models.CASCADE
    )
    name = models.CharField(max_length=60, blank=True, validators=[validate_name])
    query = models.CharField(max_length=2000, blank=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="one_view_per_name")]

    def __str__(self) -> str:
        return f"view {self.name or '(last used)'} of {self.owner}"


class ApiToken(models.Model):
    """A key for `Authorization: Token KEY`. Only its SHA-256 is stored, with the key's first
    characters (`prefix`), which tell a user's tokens apart but do not let anyone use one."""

    PREFIX_LENGTH = 8

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    # What the user calls it ("laptop"); tokens issued before names existed have none.
    name = models.CharField(max_length=100, blank=True, validators=[validate_name])
    prefix = models.CharField(max_length=PREFIX_LENGTH, blank=True, editable=False)
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    # Written by jobs.tokens at most once a minute per token, not on every request.
    last_used = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        label = self.name or "token"
        return f"{label} of {self.user} ({self.created:%Y-%m-%d})"

    @staticmethod
    def hash(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    @classmethod
    def issue(cls, user: models.Model, name: str = "") -> str:
        """A new key for the user; it exists only in what this returns."""
        key = secrets.token_urlsafe(32)
        cls.objects.create(
            user=user, name=name, prefix=key[: cls.PREFIX_LENGTH], digest=cls.hash(key)
        )
        return key


class Experiment(models.Model):
    """A hyperparameter search (jobs.services.experiments): trials of one job template, each an
    ordinary job of the owner, whose parameters a searcher (Optuna) picks and whose runs a
    pruner may stop early, judged by one metric the jobs already report.

    The searcher's own state lives in Optuna's storage, in a database (never in a process's
    memory), under `study_name`; this row and its trials are what the console shows and
    decides by. `template` is a job request as POST /api/v1/jobs takes it; `space` maps an
    argument (`--lr`) or a variable (`$OPTIMIZER`) to its distribution.
    """

    class State(models.TextChoices):
        """running -> paused -> running; running | paused -> stopping -> stopped (a user's
        stop: its running trials are cancelled); running -> finished (the budget is spent or
        the space exhausted, and every trial has ended); any -> failed (the template can no
        longer be submitted at all, e.g. its image was removed)."""

        RUNNING = "running"
        PAUSED = "paused"
        STOPPING = "stopping"
        STOPPED = "stopped"
        FINISHED = "finished"
        FAILED = "failed"

    ACTIVE_STATES = (State.RUNNING, State.PAUSED, State.STOPPING)

    class Goal(models.TextChoices):
        MAXIMIZE = "max"
        MINIMIZE = "min"

    class Unit(models.TextChoices):
        """What a trial's progress is counted in: the pruner's rungs and "at epoch 3"."""

        EPOCH = "epoch"
        STEP = "step"

    class Searcher(models.TextChoices):
        RANDOM = "random"
        TPE = "tpe"
        GRID = "grid"

    class Pruner(models.TextChoices):
        NONE = "none"
        MEDIAN = "median"
        SUCCESSIVE_HALVING = "successive_halving"
        HYPERBAND = "hyperband"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, related_name="experiments", on_delete=models.CASCADE
    )
    name = models.CharField(max_length=200, validators=[validate_name])
    template = models.JSONField(help_text="A job request, as POST /api/v1/jobs takes it.")
    space = models.JSONField(
        help_text='{"--lr": {"type": "float", "low": 0.001, "high": 1, "log": true}, '
        '"$OPTIMIZER": {"type": "choice", "choices": ["sgd", "adam"]}}'
    )
    objective_metric = models.CharField(max_length=64)
    objective_goal = models.CharField(max_length=3, choices=Goal.choices, default=Goal.MAXIMIZE)
    objective_unit = models.CharField(max_length=5, choices=Unit.choices, default=Unit.EPOCH)
    searcher = models.CharField(max_length=20, choices=Searcher.choices, default=Searcher.TPE)
    pruner = models.CharField(max_length=20, choices=Pruner.choices, default=Pruner.NONE)
    # Pruner settings ({"min_resource": 1, "reduction_factor": 3, ...}); {}: Optuna's defaults.
    pruner_options = models.JSONField(default=dict, blank=True)
    seed = models.BigIntegerField(null=True, blank=True)
    # The budget: how many trials in all and at once, and (None: no limit) how many core- and
    # GPU-hours its trials may use together.
    max_trials = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    parallel_trials = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    max_core_hours = models.FloatField(null=True, blank=True)
    max_gpu_hours = models.FloatField(null=True, blank=True)
    state = models.CharField(max_length=20, choices=State.choices, default=State.RUNNING)
    reason = models.TextField(blank=True, help_text="Why it waits, ended or failed.")
    study_name = models.CharField(max_length=100, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    ended = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["owner", "state"], name="experiment_owner_state")]

    def __str__(self) -> str:
        return f"experiment {self.pk} {self.name} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE_STATES


class Trial(models.Model):
    """One configuration an experiment tried: Optuna's trial `number`, its parameters, and the
    job that runs it (an ordinary job: quota, fair share, restarts, logs, page)."""

    class State(models.TextChoices):
        """waiting (asked, not yet admitted: the quota or the budget has no room) -> running
        (its job exists, whatever that job's own state) -> completed | pruned | failed."""

        WAITING = "waiting"
        RUNNING = "running"
        COMPLETED = "completed"
        PRUNED = "pruned"
        FAILED = "failed"

    ENDED_STATES = (State.COMPLETED, State.PRUNED, State.FAILED)

    experiment = models.ForeignKey(Experiment, related_name="trials", on_delete=models.CASCADE)
    number = models.PositiveIntegerField(help_text="Optuna's trial number in the study.")
    job = models.OneToOneField(
        Job, null=True, blank=True, related_name="trial", on_delete=models.SET_NULL
    )
    params = models.JSONField(default=dict, help_text='{"--lr": 0.01, "$OPTIMIZER": "adam"}')
    state = models.CharField(max_length=20, choices=State.choices, default=State.WAITING)
    # The objective as reported so far: its value at the last epoch (or step) judged, the best
    # value, and that epoch (or step). `judged_through` is the last one told to the pruner, so
    # that a resumed trial is judged only on what it reports anew.
    objective_last = models.FloatField(null=True, blank=True)
    objective_best = models.FloatField(null=True, blank=True)
    judged_through = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True, help_text='e.g. "stopped early: …"')
    created = models.DateTimeField(auto_now_add=True)
    ended = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["experiment", "number"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "number"], name="one_trial_per_number")
        ]
        indexes = [models.Index(fields=["experiment", "state"], name="trial_experiment_state")]

    def __str__(self) -> str:
        return f"trial {self.number} of experiment {self.experiment_id} ({self.state})"
