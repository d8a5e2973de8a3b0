from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from jobs import api, views
from jobs.login_throttle import AdminLoginForm, LoginForm

# Both login pages say how long to wait when the login throttle refuses an attempt.
admin.site.login_form = AdminLoginForm

urlpatterns = [
    path("", views.job_list, name="job_list"),
    path("jobs/new/", views.new_job, name="new_job"),
    path("jobs/<int:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path("nodes/", views.node_list, name="node_list"),
    path("quotas/", views.quota_list, name="quota_list"),
    path(
        "accounts/login/", auth_views.LoginView.as_view(authentication_form=LoginForm), name="login"
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("api/v1/catalog", api.catalog, name="api_catalog"),
    path("api/v1/nodes", api.node_list, name="api_nodes"),
    path("api/v1/nodes/<str:name>/drain", api.node_drain, name="api_node_drain"),
    path("api/v1/nodes/<str:name>/ready", api.node_ready, name="api_node_ready"),
    path("api/v1/jobs", api.jobs, name="api_jobs"),
    path("api/v1/jobs/<int:job_id>", api.job_detail, name="api_job"),
    path("api/v1/jobs/<int:job_id>/cancel", api.job_cancel, name="api_job_cancel"),
    path("api/v1/jobs/<int:job_id>/logs", api.job_logs, name="api_job_logs"),
    path("api/v1/jobs/<int:job_id>/logs/counts", api.job_log_counts, name="api_job_log_counts"),
    path("api/v1/jobs/<int:job_id>/logs.txt", api.job_log_text, name="api_job_log_text"),
    path("api/v1/jobs/<int:job_id>/metrics", api.job_metrics, name="api_job_metrics"),
    path(
        "api/v1/jobs/<int:job_id>/metrics/summary",
        api.job_metrics_summary,
        name="api_job_metrics_summary",
    ),
    path("api/v1/jobs/<int:job_id>/metrics.csv", api.job_metrics_csv, name="api_job_metrics_csv"),
    path(
        "api/v1/jobs/<int:job_id>/metrics.tensorboard.tar.gz",
        api.job_metrics_tensorboard,
        name="api_job_metrics_tensorboard",
    ),
    path("api/v1/jobs/<int:job_id>/baseline", api.job_baseline, name="api_job_baseline"),
    path(
        "api/v1/jobs/<int:job_id>/baseline-run", api.job_baseline_run, name="api_job_baseline_run"
    ),
]
