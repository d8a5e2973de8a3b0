"""Django admin: images, packages, quotas, nodes and jobs for administrators."""

from django.contrib import admin

from jobs.models import FrameworkImage, Job, JobRole, Node, Package, Quota, Replica


@admin.register(FrameworkImage)
class FrameworkImageAdmin(admin.ModelAdmin):
    list_display = ("name", "framework", "enabled", "description")
    list_filter = ("framework", "enabled")


@admin.register(Package)
class PackageAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "cpu",
        "gpus",
        "gpu_model",
        "memory_gb",
        "price_per_hour",
        "roles",
        "enabled",
    )
    list_filter = ("enabled",)


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ("__str__", "cpu", "gpus", "memory_gb", "running_jobs")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "address", "state", "cpu", "gpus", "memory_gb", "last_heartbeat")
    list_filter = ("state",)


class JobRoleInline(admin.TabularInline):
    model = JobRole
    extra = 0
    can_delete = False
    readonly_fields = ("role", "package", "instances")


class ReplicaInline(admin.TabularInline):
    model = Replica
    extra = 0
    can_delete = False
    readonly_fields = (
        "role",
        "index",
        "package",
        "node",
        "state",
        "exit_code",
        "started",
        "finished",
    )


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "image", "state", "cpu_total", "gpus_total", "created")
    list_filter = ("state", "image")
    search_fields = ("name", "owner__username")
    inlines = [JobRoleInline, ReplicaInline]
    # State is written by the lifecycle service only; admins cancel through the job page.
    readonly_fields = (
        "state",
        "reason",
        "log_complete",
        "started",
        "finished",
        "cpu_total",
        "gpus_total",
        "memory_gb_total",
        "price_per_hour",
    )
