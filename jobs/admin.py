"""Django admin: images, packages, quotas, nodes and jobs for administrators."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.account_forms import AdminChangePasswordForm
from jobs.models import (
    AgentCredential,
    ApiToken,
    DirectoryAccount,
    FrameworkImage,
    HealthEvent,
    Job,
    JobAttempt,
    JobRole,
    Node,
    Package,
    PriorityClass,
    Quota,
    Replica,
    SlurmPool,
    UnixAccount,
)
from jobs.services import agent_access, deletion, nodes, revocation, tokens
from jobs.services.lifecycle import schedule_requests

# Named as the console is; templates/admin/base_site.html gives it the console's colours and a
# way back to the console's own pages.
admin.site.site_header = "Trainyard administration"
admin.site.site_title = "Trainyard admin"
admin.site.index_title = "Images, packages, quotas, nodes, jobs and users"
# "View site" leads back to the console.
admin.site.site_url = "/"


@admin.register(FrameworkImage)
class FrameworkImageAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "framework",
        "container_image",
        "enabled",
        "log_lines_per_second",
        "log_max_mb",
        "metric_points_per_second",
        "description",
    )
    list_filter = ("framework", "enabled")
    filter_horizontal = ("slurm_pools",)


@admin.register(SlurmPool)
class SlurmPoolAdmin(admin.ModelAdmin):
    """A partition of a Slurm cluster jobs can run in (docs/slurm.md says what each field is
    for); an image or package runs there once it names the pool."""

    list_display = ("name", "partition", "shared_root", "enabled")
    list_filter = ("enabled",)


@admin.register(UnixAccount)
class UnixAccountAdmin(admin.ModelAdmin):
    """Which Unix account a person's jobs run as, on pools that run jobs as their owners."""

    list_display = ("user", "username", "uid", "gid", "slurm_account", "from_directory")
    search_fields = ("user__username", "username")


@admin.register(DirectoryAccount)
class DirectoryAccountAdmin(admin.ModelAdmin):
    """People who sign in through the directory: what it last said (jobs/directory.py)."""

    list_display = ("user", "dn", "checked", "refused")
    search_fields = ("user__username", "dn")
    readonly_fields = ("user", "dn", "checked", "refused")


@admin.register(Package)
class PackageAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "cpu",
        "gpus",
        "gpu_model",
        "memory_gb",
        "processes",
        "max_processes",
        "disk_gb",
        "price_per_hour",
        "roles",
        "enabled",
    )
    list_filter = ("enabled",)
    filter_horizontal = ("slurm_pools",)


class QuotaForm(forms.ModelForm):
    """The borrowing limits may be left out (0: none), as before they existed."""

    BORROW = ("borrow_cpu", "borrow_gpus", "borrow_memory_gb")

    class Meta:
        model = Quota
        fields = (
            "is_default", "user", "group", "cpu", "gpus", "memory_gb", "running_jobs",
            "max_priority", "default_time_limit", "borrow_cpu", "borrow_gpus", "borrow_memory_gb",
        )  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in self.BORROW:
            self.fields[name].required = False

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name in self.BORROW:
            if data.get(name) is None and name not in self.errors:
                data[name] = 0
        return data


@admin.register(PriorityClass)
class PriorityClassAdmin(admin.ModelAdmin):
    """Jobs keep the value their class had when they were submitted: an edit orders the jobs
    submitted after it; what a class may do (preempt, be preempted) applies at once."""

    list_display = (
        "name", "value", "may_preempt", "may_be_preempted", "default_time_limit", "description",
    )  # fmt: skip


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    form = QuotaForm
    list_display = (
        "__str__", "cpu", "gpus", "memory_gb", "running_jobs", "max_priority",
        "default_time_limit", "borrowing",
    )  # fmt: skip
    fields = QuotaForm.Meta.fields

    @admin.display(description="may borrow")
    def borrowing(self, quota: Quota) -> str:
        """A group's borrowing limit beyond its quota (its nominal share), in brief."""
        parts = [
            f"{n} {label}"
            for n, label in (
                (quota.borrow_cpu, "CPU"),
                (quota.borrow_gpus, "GPU"),
                (quota.borrow_memory_gb, "GB"),
            )
            if n
        ]
        return ", ".join(parts) or "—"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Admins see and revoke (delete) tokens; they never see a token's digest, and make none
    here: a key is shown once, to its owner, on their API tokens page."""

    list_display = ("name", "key_prefix", "user", "created", "last_used")
    list_filter = ("created", "last_used")
    search_fields = ("name", "prefix", "user__username")
    fields = ("name", "key_prefix", "user", "created", "last_used")
    readonly_fields = ("key_prefix", "user", "created", "last_used")

    @admin.display(description="key", ordering="prefix")
    def key_prefix(self, token: ApiToken) -> str:
        return f"{token.prefix}…" if token.prefix else "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    # Deleting here is revoking: through the service, so the token's open streams end too.
    def delete_model(self, request: HttpRequest, obj: ApiToken) -> None:
        tokens.revoke(obj.user, obj.pk)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset.select_related("user"):
            tokens.revoke(token.user, token.pk)


admin.site.unregister(User)


@admin.register(User)
class TrainyardUserAdmin(UserAdmin):
    """Django's user admin, where taking a user's access away also ends their open streams: a
    password change (revoking their API tokens unless kept), deactivation and deletion."""

    change_password_form = AdminChangePasswordForm
    change_user_password_template = "admin/trainyard/change_password.html"  # noqa: S105

    def save_model(self, request: HttpRequest, obj: User, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change and "is_active" in form.changed_data and not obj.is_active:
            revocation.tell_streams_on_commit(obj.pk)

    def delete_model(self, request: HttpRequest, obj: User) -> None:
        user_id = obj.pk
        super().delete_model(request, obj)
        revocation.tell_streams_on_commit(user_id)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        user_ids = list(queryset.values_list("pk", flat=True))
        super().delete_queryset(request, queryset)
        for user_id in user_ids:
            revocation.tell_streams_on_commit(user_id)


CAPACITY_FIELDS = ("cpu", "gpus", "memory_gb")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "status",
        "address",
        "cpu",
        "gpus",
        "gpu_model",
        "memory_gb",
        "capacity_set_by_admin",
        "last_heartbeat",
    )
    list_filter = ("state",)
    fields = (
        "name",
        "address",
        "state",
        "labels",
        "cpu",
        "gpus",
        "memory_gb",
        "capacity_set_by_admin",
        "reported_cpu",
        "reported_gpus",
        "reported_memory_gb",
        "gpu_model",
        "running",
        "last_heartbeat",
        "registered",
    )
    readonly_fields = (
        "name",
        "address",
        "reported_cpu",
        "reported_gpus",
        "reported_memory_gb",
        "gpu_model",
        "running",
        "last_heartbeat",
        "registered",
    )
    actions = (
        "drain",
        "drain_and_evict",
        "return_to_service",
        "use_reported_capacity",
        "make_agent_credentials",
    )

    @admin.display(description="status")
    def status(self, node: Node) -> str:
        return node.status

    # A node joins when its agent does (with its own credentials, reporting what the host
    # has); one added here would be a row no agent answers for.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Node, form: Any, change: bool) -> None:
        # An admin who edits the capacity means it: later heartbeats must not undo it.
        if change and any(f in form.changed_data for f in CAPACITY_FIELDS):
            obj.capacity_set_by_admin = True
        super().save_model(request, obj, form, change)
        schedule_requests.request_schedule()

    @admin.action(description="Drain: no new work (running work continues)")
    def drain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        nodes.drain([n.name for n in queryset])

    @admin.action(
        description=f"Drain and evict: running jobs get SIGTERM and "
        f"{nodes.EVICT_GRACE_SECONDS:.0f} s to checkpoint, then restart on other nodes"
    )
    def drain_and_evict(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        names = [n.name for n in queryset]
        evicted = nodes.drain(names, evict=True, by=request.user.get_username())
        self.message_user(
            request,
            f"Drained {', '.join(names)}; evicted "
            + (f"jobs {', '.join(map(str, evicted))}." if evicted else "no job."),
        )

    @admin.action(description="Return to service (ready for new work)")
    def return_to_service(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        nodes.return_to_service([n.name for n in queryset])

    @admin.action(description="Advertise what the agent reports")
    def use_reported_capacity(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset:
            node.cpu, node.gpus, node.memory_gb = (
                node.reported_cpu,
                node.reported_gpus,
                node.reported_memory_gb,
            )
            node.capacity_set_by_admin = False
            node.save()
        schedule_requests.request_schedule()

    @admin.action(description="Make or rotate agent credentials (shows each REDIS_URL once)")
    def make_agent_credentials(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset:
            try:
                url = agent_access.issue_url(node.name)
            except ValueError as exc:
                self.message_user(request, str(exc), level=messages.ERROR)
                continue
            self.message_user(
                request,
                f"{node.name}: REDIS_URL={url} (shown once; its agent's old secret no longer "
                "works)",
                level=messages.WARNING,
            )


@admin.register(AgentCredential)
class AgentCredentialAdmin(admin.ModelAdmin):
    """Which nodes have credentials, and since when; never a secret (none is kept here)."""

    list_display = ("node_name", "created", "rotated")
    fields = ("node_name", "created", "rotated")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # made by `manage.py agent_credentials` or the nodes' action

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class WrittenByServicesInline(admin.TabularInline):
    """A job's rows that the services write as it is submitted and runs: shown, never added
    by hand (an added role or replica would go around the quota and placement)."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class JobRoleInline(WrittenByServicesInline):
    model = JobRole
    readonly_fields = ("role", "package", "instances")


class ReplicaInline(WrittenByServicesInline):
    model = Replica
    readonly_fields = (
        "attempt",
        "role",
        "index",
        "package",
        "node",
        "state",
        "exit_code",
        "started",
        "finished",
    )


class JobAttemptInline(WrittenByServicesInline):
    model = JobAttempt
    readonly_fields = ("number", "started", "finished", "nodes", "reason", "counted")


class HealthEventInline(WrittenByServicesInline):
    model = HealthEvent
    readonly_fields = ("at", "attempt", "rule", "action", "role", "index", "node", "value",
                       "message", "outcome")  # fmt: skip


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "owner",
        "image",
        "state",
        "cpu_total",
        "gpus_total",
        "created",
        "keep",
    )
    list_filter = ("state", "image", "keep")
    search_fields = ("name", "owner__username")

    # A job comes through the New-job form, the API or the CLI, which check it (its roles, the
    # packages and the quota) and place it; one saved here would go around all of that.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    # Deleting goes through the service, which also has the job's checkpoints removed; a job
    # that may still run cannot be deleted (cancel it first).
    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return super().has_delete_permission(request, obj) and not (obj and obj.is_active)

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        deletion.delete_job(obj.pk)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        for job_id in queryset.values_list("pk", flat=True):
            try:
                deletion.delete_job(job_id)
            except deletion.JobStillActive as exc:
                self.message_user(request, str(exc), level=messages.ERROR)

    inlines = [JobRoleInline, JobAttemptInline, HealthEventInline, ReplicaInline]
    # State is written by the transitions service only; admins cancel through the job page.
    readonly_fields = (
        "state",
        "reason",
        "attempt",
        "restarts_used",
        "restart_at",
        "excluded_nodes",
        "log_complete",
        "logs_pruned",
        "started",
        "finished",
        "cpu_total",
        "gpus_total",
        "memory_gb_total",
        "price_per_hour",
    )
