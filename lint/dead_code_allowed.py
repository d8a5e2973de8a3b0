"""What lint/vulture.sh would call unused, but is used where vulture does not look: settings
Django reads, schema fields Django Ninja serialises, model fields and form attributes read by
name, template variables, signatures a framework or protocol fixes (__exit__, pytest hooks,
Lightning's training_step), and names used from strings (a stack's `manage.py shell -c`).

Listed 2026-11-29 when the check came in, each with where it is; a new entry needs the same
reason. Anything else vulture reports is dead: remove it. (Code that only tests call is used,
to vulture; issue 43 removed what it found of that by hand.)"""

# ruff: noqa
# mypy: ignore-errors
in_use_memory_gb  # unused variable (bench/fleet.py:85)
INSTALLED_APPS  # unused variable (console/settings.py:67)
MIDDLEWARE  # unused variable (console/settings.py:81)
SECURE_CONTENT_TYPE_NOSNIFF  # unused variable (console/settings.py:104)
SECURE_REFERRER_POLICY  # unused variable (console/settings.py:105)
SECURE_CROSS_ORIGIN_OPENER_POLICY  # unused variable (console/settings.py:106)
X_FRAME_OPTIONS  # unused variable (console/settings.py:107)
SECURE_REDIRECT_EXEMPT  # unused variable (console/settings.py:140)
ROOT_URLCONF  # unused variable (console/settings.py:142)
ASGI_APPLICATION  # unused variable (console/settings.py:143)
TEMPLATES  # unused variable (console/settings.py:145)
DEFAULT_AUTO_FIELD  # unused variable (console/settings.py:187)
AUTHENTICATION_BACKENDS  # unused variable (console/settings.py:190)
AUTH_PASSWORD_VALIDATORS  # unused variable (console/settings.py:199)
LOGIN_URL  # unused variable (console/settings.py:203)
LOGIN_REDIRECT_URL  # unused variable (console/settings.py:204)
LOGOUT_REDIRECT_URL  # unused variable (console/settings.py:205)
LANGUAGE_CODE  # unused variable (console/settings.py:207)
TIME_ZONE  # unused variable (console/settings.py:208)
FORMAT_MODULE_PATH  # unused variable (console/settings.py:210)
USE_I18N  # unused variable (console/settings.py:211)
USE_TZ  # unused variable (console/settings.py:212)
STATIC_URL  # unused variable (console/settings.py:214)
STATICFILES_DIRS  # unused variable (console/settings.py:215)
STATIC_ROOT  # unused variable (console/settings.py:218)
WHITENOISE_USE_FINDERS  # unused variable (console/settings.py:219)
CHANNEL_LAYERS  # unused variable (console/settings.py:240)
CACHES  # unused variable (console/settings.py:265)
CELERY_BROKER_USE_SSL  # unused variable (console/settings.py:269)
CELERY_TASK_SERIALIZER  # unused variable (console/settings.py:270)
CELERY_ACCEPT_CONTENT  # unused variable (console/settings.py:271)
CELERY_RESULT_SERIALIZER  # unused variable (console/settings.py:272)
CELERY_TASK_IGNORE_RESULT  # unused variable (console/settings.py:273)
CELERY_TASK_ACKS_LATE  # unused variable (console/settings.py:274)
CELERY_TASK_REJECT_ON_WORKER_LOST  # unused variable (console/settings.py:275)
CELERY_WORKER_PREFETCH_MULTIPLIER  # unused variable (console/settings.py:276)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP  # unused variable (console/settings.py:277)
CELERY_TASK_DEFAULT_QUEUE  # unused variable (console/settings.py:278)
CELERY_WORKER_HIJACK_ROOT_LOGGER  # unused variable (console/settings.py:279)
LOGGING  # unused variable (console/settings.py:405)
_.login_form  # unused attribute (console/urls.py:11)
own_quota  # unused variable (jobs/account_forms.py:67)
_.required  # unused attribute (jobs/admin.py:98)
actions  # unused variable (jobs/admin.py:242)
can_delete  # unused variable (jobs/admin.py:335)
inlines  # unused variable (jobs/admin.py:408)
param_name  # unused variable (jobs/api.py:114)
param_name  # unused variable (jobs/api.py:130)
JobsConfig  # unused class (jobs/apps.py:4)
script_path  # unused variable (jobs/forms.py:175)
snapshot_script  # unused variable (jobs/forms.py:182)
server_package  # unused variable (jobs/forms.py:207)
worker_package  # unused variable (jobs/forms.py:209)
_.max_value  # unused attribute (jobs/forms.py:319)
server_package  # unused variable (jobs/forms.py:522)
worker_package  # unused variable (jobs/forms.py:524)
STATE_FORMAT  # unused variable (jobs/healthrules.py:99)
ThrottledModelBackend  # unused class (jobs/login_throttle.py:218)
_.bold  # unused attribute (jobs/logshape.py:52)
_.dim  # unused attribute (jobs/logshape.py:52)
_.italic  # unused attribute (jobs/logshape.py:52)
_.underline  # unused attribute (jobs/logshape.py:52)
_.bold  # unused attribute (jobs/logshape.py:65)
_.dim  # unused attribute (jobs/logshape.py:65)
_.italic  # unused attribute (jobs/logshape.py:67)
_.underline  # unused attribute (jobs/logshape.py:69)
incarnation_since  # unused variable (jobs/models.py:469)
registered  # unused variable (jobs/models.py:483)
PageTemplates  # unused class (jobs/page_templates.py:27)
own_days  # unused variable (jobs/schemas.py:251)
log_dropped  # unused variable (jobs/schemas.py:390)
time_limit_ends  # unused variable (jobs/schemas.py:402)
priority_value  # unused variable (jobs/schemas.py:410)
kvstore_modes  # unused variable (jobs/schemas.py:486)
priority_classes  # unused variable (jobs/schemas.py:591)
time_zone  # unused variable (jobs/schemas.py:595)
max_instances  # unused variable (jobs/schemas.py:599)
workers_reporting  # unused variable (jobs/schemas.py:672)
final_eval_accuracy  # unused variable (jobs/schemas.py:687)
baseline_eval_accuracy  # unused variable (jobs/schemas.py:688)
target_eval_accuracy  # unused variable (jobs/schemas.py:697)
baseline_sps  # unused variable (jobs/schemas.py:706)
samples_per_dollar_ratio  # unused variable (jobs/schemas.py:710)
why_no_speedup  # unused variable (jobs/schemas.py:718)
has_single_worker_run  # unused variable (jobs/schemas.py:734)
cost_so_far  # unused variable (jobs/schemas.py:744)
file_count  # unused variable (jobs/schemas.py:807)
evicted_jobs  # unused variable (jobs/schemas.py:871)
duration_seconds  # unused variable (jobs/schemas.py:953)
metric_names  # unused variable (jobs/schemas.py:975)
charts  # unused variable (jobs/schemas.py:994)
max_rss_mb  # unused variable (jobs/schemas.py:314): SlurmRecordOut, serialised by Django Ninja
modified  # unused variable (jobs/api_artifacts.py:33): ArtifactOut, serialised by Django Ninja
_.incarnation_since  # unused attribute (jobs/services/nodes.py:235)
borrow_limit  # unused variable (jobs/services/views/group_shares.py:21)
in_use  # unused variable (jobs/services/views/group_shares.py:22)
file_size  # unused variable (jobs/upload_limit.py:46)
_.CHANNEL_LAYERS  # unused attribute (tests/conftest.py:90)
exitstatus  # unused variable (tests/conftest.py:483)
_.training_step  # unused method (tests/fixtures/code/lightning_ddp.py:20)
_.configure_optimizers  # unused method (tests/fixtures/code/lightning_ddp.py:26)
_.validation_step  # unused method (tests/fixtures/code/lightning_bug_report.py:48)
bob_job  # unused variable (tests/integration/test_escape.py:34)
start_at  # unused function (tests/job_ids.py:9)
_.FILE_UPLOAD_TEMP_DIR  # unused attribute (tests/unit/test_disk_full.py:123)
_.FILE_UPLOAD_MAX_MEMORY_SIZE  # unused attribute (tests/unit/test_disk_full.py:124)
_.FILE_UPLOAD_TEMP_DIR  # unused attribute (tests/unit/test_disk_full.py:130)
_.PASSWORD_HASHERS  # unused attribute (tests/unit/test_login_throttle.py:37)
_.CACHES  # unused attribute (tests/unit/test_login_throttle.py:253)
_.CACHES  # unused attribute (tests/unit/test_login_throttle.py:261)
two_nodes  # unused variable (tests/unit/test_node_isolation.py:47)
two_nodes  # unused variable (tests/unit/test_node_isolation.py:59)
two_nodes  # unused variable (tests/unit/test_node_isolation.py:75)
two_nodes  # unused variable (tests/unit/test_node_isolation.py:85)
stopping_until  # unused variable (tests/unit/test_preemption_simulation.py:53)
_.stopping_until  # unused attribute (tests/unit/test_preemption_simulation.py:179)
_.stopping_until  # unused attribute (tests/unit/test_preemption_simulation.py:201)
_.mtime  # unused attribute (tests/unit/test_snapshot_archives.py:71)
_.uname  # unused attribute (tests/unit/test_snapshot_archives.py:71)
_.pax_headers  # unused attribute (tests/unit/test_snapshot_archives.py:327)
_.CHANNEL_LAYERS  # unused attribute (tests/unit/test_ws_origin.py:20)
OK  # unused variable (trainyard_cli/errors.py:9)
_._trees  # unused attribute (workers/metricfeed.py:188)
exc_type  # unused variable (workers/ps/kvstore.py:202)
tb  # unused variable (workers/ps/kvstore.py:204)
tarinfo  # unused variable (workers/snapshot.py:184)
_.mtime  # unused attribute (workers/snapshot.py:325)
_.gid  # unused attribute (workers/snapshot.py:326)
_.gname  # unused attribute (workers/snapshot.py:327)
_.uname  # unused attribute (workers/snapshot.py:327)
_.log_errors  # unused attribute (workers/userregex.py:66)
slurm_partition  # unused variable (jobs/forms.py:229): read by name, "slurm_<option>"
slurm_qos  # unused variable (jobs/forms.py:231): read by name, "slurm_<option>"
slurm_constraint  # unused variable (jobs/forms.py:232): read by name, "slurm_<option>"
slurm_reservation  # unused variable (jobs/forms.py:233): read by name, "slurm_<option>"
slurm_exclusive  # unused variable (jobs/forms.py:234): a form field, read from cleaned_data
job_accounts  # unused variable (jobs/models.py): read by name (slurm_choices.CHOSEN)
job_qos  # unused variable (jobs/models.py): read by name (slurm_choices.CHOSEN)
job_constraints  # unused variable (jobs/models.py): read by name (slurm_choices.CHOSEN)
job_reservations  # unused variable (jobs/models.py): read by name (slurm_choices.CHOSEN)
exc_text  # unused attribute (console/logfilters.py:15): logging.Formatter reads it
possibilities  # unused attribute (trainyard_cli/main.py:176): the usage error's format_message reads it
NoClientErrorTracebacks  # unused class (console/logfilters.py:6): named in settings.LOGGING
updated  # unused variable (jobs/models.py, RunTableView): auto_now, written by name (run_table.remember)
metric_summary  # unused variable (jobs/schemas.py, JobOut): a schema field Django Ninja serialises
startup_trials  # unused variable (jobs/experiment_forms.py, SearchForm): form fields read by name (PRUNER_OPTION_FIELDS)
min_resource  # unused variable (jobs/experiment_forms.py, SearchForm): form fields read by name (PRUNER_OPTION_FIELDS)
reduction_factor  # unused variable (jobs/experiment_forms.py, SearchForm): form fields read by name (PRUNER_OPTION_FIELDS)
AUTH_LDAP_SERVER_URI  # unused attribute (tests/unit/test_directory.py): a setting django-auth-ldap reads by name
sandbox_uid  # unused variable (jobs/services/identity.py, Profile): read by the profile template
ThrottledDirectoryBackend  # unused class (jobs/directory.py): named in settings.AUTHENTICATION_BACKENDS
SingleSignOnBackend  # unused class (jobs/single_sign_on.py): named in settings.AUTHENTICATION_BACKENDS
__new__  # unused function (jobs/single_sign_on.py): Django instantiates the backend by its path
verify_claims  # unused method (jobs/single_sign_on.py): mozilla-django-oidc's hook
filter_users_by_claims  # unused method (jobs/single_sign_on.py): mozilla-django-oidc's hook
last_name  # unused attribute (jobs/single_sign_on.py): a User field, saved
authentication_form  # unused variable (jobs/single_sign_on.py, LoginView): Django's LoginView reads it
__getattr__  # unused function (stack/oidc_provider.py): the module's urlconf and validator, looked up by name
daemon_threads  # unused variable (stack/oidc_provider.py): socketserver's ThreadingMixIn reads it
log_message  # unused method (stack/oidc_provider.py): wsgiref's handler calls it
_split_scope  # unused method (tests/file_groups.py): pytest-xdist's scheduler calls it
max_workers  # unused variable (jobs/forms.py): a form field, read from cleaned_data by name
