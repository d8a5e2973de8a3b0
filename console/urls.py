from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

# api_artifacts and api_experiments are imported for their operations, which register on
# api.api (a job's artifacts; experiments).
from jobs import (  # noqa: F401
    account_views,
    api,
    api_artifacts,
    api_experiments,
    experiment_views,
    form_views,
    run_views,
    single_sign_on,
    user_views,
    views,
)
from jobs.login_throttle import AdminLoginForm

# Both login pages say how long to wait when the login throttle refuses an attempt.
admin.site.login_form = AdminLoginForm

urlpatterns = [
    path("", views.job_list, name="job_list"),
    path("jobs/new/", views.new_job, name="new_job"),
    path("jobs/new/preview/", form_views.job_preview, name="job_preview"),
    path("jobs/new/health-rules/", form_views.health_rules_check, name="health_rules_check"),
    path("jobs/<int:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path("jobs/<int:job_id>/again/", views.job_edit_again, name="job_edit_again"),
    path("jobs/<int:job_id>/run-again/", views.job_run_again, name="job_run_again"),
    path("jobs/<int:job_id>/retention/", views.job_retention, name="job_retention"),
    path("jobs/<int:job_id>/labels/", run_views.job_labels, name="job_labels"),
    path("jobs/views/save/", run_views.run_view_save, name="run_view_save"),
    path("jobs/views/delete/", run_views.run_view_delete, name="run_view_delete"),
    path("compare/", views.compare_page, name="compare"),
    path("experiments/", experiment_views.experiment_list, name="experiment_list"),
    path("experiments/new/", experiment_views.experiment_new, name="experiment_new"),
    path(
        "experiments/<int:experiment_id>/",
        experiment_views.experiment_detail,
        name="experiment_detail",
    ),
    path(
        "experiments/<int:experiment_id>/pause/",
        experiment_views.experiment_pause,
        name="experiment_pause",
    ),
    path(
        "experiments/<int:experiment_id>/resume/",
        experiment_views.experiment_resume,
        name="experiment_resume",
    ),
    path(
        "experiments/<int:experiment_id>/stop/",
        experiment_views.experiment_stop,
        name="experiment_stop",
    ),
    path("nodes/", views.node_list, name="node_list"),
    path("queue/", views.queue_page, name="queue"),
    path("quotas/", views.quota_list, name="quota_list"),
    path("storage/", views.storage_page, name="storage"),
    path("account/", account_views.profile, name="profile"),
    path("account/tokens/", account_views.token_list, name="token_list"),
    path("account/tokens/<int:token_id>/revoke/", account_views.token_revoke, name="token_revoke"),
    path("account/password/", account_views.password_change, name="password_change"),
    path("users/", user_views.user_list, name="user_list"),
    path("users/<int:user_id>/", user_views.user_edit, name="user_edit"),
    path("users/groups/<int:group_id>/", user_views.group_edit, name="group_edit"),
    path("accounts/login/", single_sign_on.LoginView.as_view(), name="login"),
    # The organisation's OpenID Connect provider, where one is set (404 elsewhere).
    path("oidc/authenticate/", single_sign_on.start, name="oidc_authentication_init"),
    path("oidc/callback/", single_sign_on.callback, name="oidc_authentication_callback"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # The admin's "change password" (your own) is the account page: one place where a
    # password change also decides about the API tokens.
    path("admin/password_change/", RedirectView.as_view(pattern_name="password_change")),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    # Browsers ask for /favicon.ico whatever a page links (the admin's pages link none).
    path("favicon.ico", RedirectView.as_view(url=static("trainyard/favicon.svg"), permanent=True)),
    # API v1 (django-ninja): every api/v1/... path, plus openapi.json and docs.
    path("api/v1/", api.api.urls),
]
