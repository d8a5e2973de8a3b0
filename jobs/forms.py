"""The New job form: turns its fields into the same request dict the API takes."""

import json
import shlex
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User

from jobs import json_limits
from jobs.models import (
    MAX_RESTARTS_LIMIT,
    RESTART_BACKOFF_DEFAULT_SECONDS,
    RESTART_BACKOFF_MAX_SECONDS,
    Framework,
    FrameworkImage,
    KVStoreMode,
    Package,
    PriorityClass,
    RestartPolicy,
    SlurmPool,
)
from jobs.money import format_price
from jobs.schemas import RoleIn
from jobs.services import code_choices, unservable
from jobs.services.lifecycle.time_limits import default_for
from jobs.services.slurm import slurm_choices
from jobs.time_limit_text import in_words

# The program menu's values besides the examples' names and the code root's paths: "type a
# path" (script_path says which), and "snapshot:SHA256" for the user's uploaded code
# (snapshot_script says which file in it).
PATH_CHOICE = "__path__"
SNAPSHOT_CHOICE = "snapshot:"

# Which form field shows an error the services report for a request field.
FIELD_FOR_ERROR = {
    "name": "name",
    "image": "image",
    "container_image": "container_image",
    "program": "script",
    "program.script": "script",
    "program.args": "args",
    "kvstore": "kvstore",
    "roles.master.package": "package",
    "roles.worker.package": "package",
    "roles.master.instances": "instances",
    "roles.worker.instances": "instances",
    "restart": "restart_policy",
    "restart.policy": "restart_policy",
    "restart.max_restarts": "max_restarts",
    "restart.backoff_seconds": "restart_backoff_seconds",
    "restart.exclude_failed_node": "exclude_failed_node",
    "restart.args_on_resume": "args_on_resume",
    "data": "data_folders",
    "results": "results_folder",
    "one_instance_per_node": "one_instance_per_node",
    "health_rules": "health_rules",
    "env": "env",
    "time_limit": "time_limit",
    "project": "project",
    "tags": "tags",
    "priority": "priority",
    "pool": "pool",
    "slurm": "pool",
}
# The Slurm options a job chooses a value of, each a field "slurm_<option>" of the form.
SLURM_FIELDS = ("partition", "account", "qos", "constraint", "reservation")
# A parameter-server form has its own worker fields, and server fields.
PS_FIELD_FOR_ERROR = {
    **FIELD_FOR_ERROR,
    "roles.server": "servers",
    "roles.worker": "workers",
    "roles.server.package": "server_package",
    "roles.server.instances": "servers",
    "roles.worker.package": "worker_package",
    "roles.worker.instances": "workers",
}

# What the form offers when a user picks a restart on failure without saying how many.
RESTARTS_WHEN_ON_FAILURE = 3


def _priority_label(pclass: PriorityClass) -> str:
    """ "high — may preempt": what a class may do, beside its name."""
    can = [
        words
        for words, yes in (
            ("may preempt", pclass.may_preempt),
            ("may be preempted", pclass.may_be_preempted),
        )
        if yes
    ]
    return f"{pclass.name} — {', '.join(can)}" if can else pclass.name


class PackageSelect(forms.Select):
    """A package menu whose packages the user could never run (jobs.services.unservable) are
    offered disabled, saying why."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unservable: dict[str, str] = {}

    def create_option(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        option: dict[str, Any] = super().create_option(*args, **kwargs)
        why = self.unservable.get(str(option["value"]))
        if why:
            option["attrs"].update(disabled=True, title=why, **{"data-unservable": why})
            option["label"] = f"{option['label']} — unavailable: {why}"
        return option


# Far above what MAX_RULES rules take; the API's body is bounded by the upload limit.
MAX_HEALTH_RULES_CHARS = 64 * 1024


def read_health_rules(text: str | None) -> Any:
    """The health-rules box's JSON, None when it is empty (the image's rules). Only the JSON is
    read here, with the API's depth limit (jobs/json_limits.py): jobs.healthrules judges the
    rules."""
    text = (text or "").strip()
    if not text:
        return None
    if len(text) > MAX_HEALTH_RULES_CHARS:
        raise forms.ValidationError(
            f"The rules are {len(text):,} characters long; at most {MAX_HEALTH_RULES_CHARS:,}."
        )
    try:
        return json_limits.loads(text)
    except json_limits.TooDeep as exc:
        raise forms.ValidationError(f"The rules are {exc}.") from None
    except ValueError as exc:
        raise forms.ValidationError(f"The rules are not valid JSON: {exc}.") from None


def _fewest(instances: Any) -> Any:
    """A role's count as the form's count field shows it: an elastic role's minimum."""
    return instances["min"] if isinstance(instances, dict) else instances


def _most(instances: Any) -> int | None:
    return instances["max"] if isinstance(instances, dict) else None


def roles_of(framework: str, data: dict[str, Any]) -> dict[str, Any]:
    """The request's roles from the form's fields: one package and count for PyTorch (instance
    0 is the master), each role's own for a parameter-server image."""
    if framework == Framework.KVSTORE:
        return {
            "server": {"package": data["server_package"], "instances": data["servers"]},
            "worker": {"package": data["worker_package"], "instances": _workers(data)},
        }
    roles: dict[str, Any] = {"master": {"package": data["package"], "instances": 1}}
    most = data.get("max_instances")
    if most and most > data["instances"]:
        # Elastic: the workers between the two counts, the master always one.
        workers: dict[str, int] = {"min": data["instances"] - 1, "max": most - 1}
        roles["worker"] = {"package": data["package"], "instances": workers}
    elif data["instances"] > 1:
        roles["worker"] = {"package": data["package"], "instances": data["instances"] - 1}
    return roles


def _workers(data: dict[str, Any]) -> int | dict[str, int]:
    """A parameter-server form's workers: a count, or {min, max} up to its "Up to"."""
    most = data.get("max_workers")
    if most and data["workers"] and most > data["workers"]:
        return {"min": data["workers"], "max": most}
    return data["workers"]


def _fields_of(framework: str) -> tuple[str, ...]:
    if framework == Framework.KVSTORE:
        return ("kvstore", "server_package", "servers", "worker_package", "workers")
    return ("package", "instances")


class _ShapeForm(forms.Form):
    """What the New-job form and its preview share: the framework of the chosen image, and the
    fields that framework needs (one package and count for PyTorch, each role's for a
    parameter-server image)."""

    optional_fields: tuple[str, ...] = ()

    def framework(self) -> str:
        image = FrameworkImage.objects.filter(name=self.cleaned_data.get("image")).first()
        return image.framework if image else Framework.PYTORCH

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name in _fields_of(self.framework()):
            needed = name not in self.optional_fields
            if needed and data.get(name) in (None, "") and name not in self.errors:
                self.add_error(name, "This field is required.")
        return data


class NewJobForm(_ShapeForm):
    name = forms.CharField(max_length=200)
    # How the run is filed (jobs.labels checks them, as for the API): Edit and run again
    # fills them from the job.
    project = forms.CharField(
        required=False, max_length=100, help_text="Optional: groups runs in the job list."
    )
    tags = forms.CharField(
        required=False, max_length=1000, help_text="Optional labels, separated by spaces."
    )
    image = forms.ChoiceField()
    # Shown only for an image whose admin lets users bring their own (new_job.js).
    container_image = forms.CharField(
        required=False,
        max_length=300,
        label="Your own container image",
        widget=forms.TextInput(attrs={"spellcheck": "false", "autocomplete": "off"}),
        help_text="Optional: an OCI image reference to run the trainers in instead of the "
        "image's; the image's framework still decides how they launch.",
    )
    script = forms.ChoiceField(
        label="Training program",
        help_text="A built-in example, a script under the code root, or code you uploaded.",
    )
    # Free text with suggestions (a datalist): a script the menu did not list still runs.
    script_path = forms.CharField(
        required=False,
        label="Script path",
        widget=forms.TextInput(
            attrs={"list": "code-root-scripts", "autocomplete": "off", "spellcheck": "false"}
        ),
    )
    snapshot_script = forms.CharField(
        required=False,
        label="Script in the uploaded code",
        help_text="Its path inside the upload; the list shows its Python files.",
        widget=forms.TextInput(
            attrs={"list": "snapshot-scripts", "autocomplete": "off", "spellcheck": "false"}
        ),
    )
    args = forms.CharField(
        required=False,
        label="Arguments",
        help_text="Split like a shell would, but never run through one.",
    )
    # PyTorch images: one package for every instance.
    package = forms.ChoiceField(label="Resource package", required=False, widget=PackageSelect)
    instances = forms.IntegerField(
        min_value=1,
        initial=2,
        required=False,
        help_text="Instance 0 is [master], the rest [worker-1], ...",
    )
    max_instances = forms.IntegerField(
        min_value=2,
        required=False,
        label="Up to (elastic)",
        help_text="Empty: exactly the instances above. More: it starts once those fit, grows "
        "to this many as room frees, and shrinks instead of stopping when a node is lost.",
    )
    # Parameter-server images: servers and workers each with their own package.
    kvstore = forms.ChoiceField(
        label="kvstore mode", choices=KVStoreMode.choices, initial="dist_sync", required=False
    )
    server_package = forms.ChoiceField(label="Server package", required=False, widget=PackageSelect)
    servers = forms.IntegerField(min_value=1, initial=1, required=False, label="Servers")
    worker_package = forms.ChoiceField(label="Worker package", required=False, widget=PackageSelect)
    workers = forms.IntegerField(min_value=1, initial=2, required=False, label="Workers")
    max_workers = forms.IntegerField(
        min_value=2,
        required=False,
        label="Up to (elastic workers)",
        help_text="Empty: exactly the workers above. More: elastic workers, as for PyTorch.",
    )
    one_instance_per_node = forms.BooleanField(
        label="One instance per node",
        required=False,
        help_text="No two instances share a node, however small their packages: how a job "
        "tries multi-node training (Slurm: --ntasks-per-node=1).",
    )
    priority = forms.ChoiceField(
        label="Priority",
        required=False,
        help_text="Higher goes first; a class that may preempt evicts lower ones that may be "
        "preempted (they resume from their checkpoint later).",
    )
    pool = forms.ChoiceField(
        label="Run on",
        required=False,
        help_text="Trainyard's own nodes, or a Slurm pool: there Slurm places the instances "
        "and the job waits in Slurm's queue (its reason says why).",
    )
    # A job's own Slurm options (slurm_choices): what the pools let a job choose. A field no
    # pool offers a choice of is not shown; the services check the choice against the pool.
    slurm_partition = forms.ChoiceField(label="Slurm partition", required=False)
    slurm_account = forms.ChoiceField(label="Slurm account", required=False)
    slurm_qos = forms.ChoiceField(label="Slurm QOS", required=False)
    slurm_constraint = forms.ChoiceField(label="Slurm constraint", required=False)
    slurm_reservation = forms.ChoiceField(label="Slurm reservation", required=False)
    slurm_exclusive = forms.BooleanField(label="Whole nodes in Slurm (exclusive)", required=False)
    restart_policy = forms.ChoiceField(
        label="When an instance fails",
        choices=[("", "the image's default")] + [(p.value, p.label) for p in RestartPolicy],
        required=False,
    )
    max_restarts = forms.IntegerField(
        label="Restarts at most",
        min_value=0,
        max_value=MAX_RESTARTS_LIMIT,
        initial=RESTARTS_WHEN_ON_FAILURE,
        required=False,
    )
    restart_backoff_seconds = forms.IntegerField(
        label="Seconds between restarts",
        min_value=0,
        max_value=RESTART_BACKOFF_MAX_SECONDS,
        initial=RESTART_BACKOFF_DEFAULT_SECONDS,
        required=False,
    )
    exclude_failed_node = forms.BooleanField(
        label="Restart away from the node that failed", required=False
    )
    args_on_resume = forms.CharField(
        required=False,
        label="Arguments for later attempts",
        help_text="What a restart or a resume after preemption adds to the arguments; an "
        "option here takes the place of the same one (e.g. --init_from=resume).",
        widget=forms.TextInput(attrs={"spellcheck": "false"}),
    )
    # Sent as typed: the services parse it (jobs.time_limit_text), as for the API and the CLI.
    time_limit = forms.CharField(
        label="Time limit",
        required=False,
        max_length=40,
        widget=forms.TextInput(attrs={"placeholder": "e.g. 2h, 90m, 1h30m", "spellcheck": "false"}),
    )
    # The page's rule editor writes this box; it stays open to editing as JSON.
    health_rules = forms.CharField(
        label="Health rules",
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text="Left empty: the image's rules. As JSON, a list of rules such as "
        '{"kind": "non-finite", "metric": "loss", "action": "stop"}.',
    )

    env = forms.CharField(
        label="Environment variables",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="NAME=value, one a line, for every process. Values of names with TOKEN, "
        "SECRET, PASSWORD or KEY in them are masked for anyone but you.",
    )
    data_folders = forms.CharField(
        label="Data folders",
        required=False,
        widget=forms.Textarea(
            attrs={"rows": 2, "spellcheck": "false", "placeholder": "/shared/datasets/vision"}
        ),
        help_text="Folders of the nodes the job reads, one a line: there, read-only, if your "
        "Unix identity may read them.",
    )
    results_folder = forms.CharField(
        label="Results folder",
        required=False,
        max_length=4096,
        widget=forms.TextInput(attrs={"spellcheck": "false"}),
        help_text="A folder of the nodes the job writes to, as you.",
    )

    def __init__(self, *args: Any, user: User | AnonymousUser | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.examples = code_choices.examples()
        self.root_scripts = code_choices.code_root_scripts(settings.TRAINYARD_CODE_ROOT)
        self.snapshots = (
            code_choices.snapshot_choices(user)
            if isinstance(user, User) and user.is_authenticated
            else []
        )
        images = list(FrameworkImage.objects.filter(enabled=True))
        self._choices(
            "image", [(i.name, f"{i.name} · container" if i.container_image else i.name)
                      for i in images]
        )  # fmt: skip
        # PyTorch first: the most common kind of job, and the form's simplest shape.
        self.fields["image"].initial = next(
            (i.name for i in images if i.framework == Framework.PYTORCH), None
        )
        self._program_menu()
        self._choices(
            "priority", [(c.name, _priority_label(c)) for c in PriorityClass.objects.all()]
        )
        self.fields["priority"].initial = PriorityClass.DEFAULT_NAME
        pools = list(SlurmPool.objects.filter(enabled=True).values_list("name", "partition"))
        if pools:
            self._choices(
                "pool",
                [("", "Trainyard's own nodes")]
                + [
                    (name, f"Slurm pool {name} (partition {partition})")
                    for name, partition in pools
                ],
            )
        else:
            del self.fields["pool"]  # nothing to choose: most consoles have no Slurm pool
        self._slurm_choices()
        packages = [
            (p.name, f"{p.name} — {p.summary} · {format_price(p.price_per_hour)}/h")
            for p in Package.objects.filter(enabled=True)
        ]
        reasons = (
            unservable.unservable_packages(user)
            if isinstance(user, User) and user.is_authenticated
            else {}
        )
        for name in ("package", "server_package", "worker_package"):
            self._choices(name, packages)
            widget = self.fields[name].widget
            assert isinstance(widget, PackageSelect)
            widget.unservable = reasons
        self.fields["server_package"].initial = "server-2c12g"
        self.fields["worker_package"].initial = "cpu-1"
        instances = self.fields["instances"]
        assert isinstance(instances, forms.IntegerField)
        instances.max_value = settings.TRAINYARD_MAX_INSTANCES
        instances.widget.attrs["max"] = settings.TRAINYARD_MAX_INSTANCES
        default = default_for(user) if isinstance(user, User) and user.is_authenticated else None
        self.fields["time_limit"].help_text = (
            "How long each attempt may hold its nodes; then it is stopped and the job fails. "
            "A limit lets it start sooner, ahead of larger jobs, when it ends before they "
            f"can start. Empty: {in_words(default) if default else 'no limit'} (your default)."
        )

    def fill_from(self, body: dict[str, Any], image_health_rules: bool = False) -> None:
        """Open the form filled with a job request (jobs.services.rerun.request_of): "Edit and
        run again". The job's roles become the form's one package and instance count; rules
        that are the image's own (`image_health_rules`) stay empty, as the form says."""
        program = body.get("program", {})
        script = str(program.get("script", ""))
        initial: dict[str, Any] = {
            "name": body.get("name", ""),
            "image": body.get("image", ""),
            "container_image": body.get("container_image") or "",
            "args": shlex.join(program.get("args", [])),
        }
        if program.get("snapshot"):
            initial["script"] = SNAPSHOT_CHOICE + program["snapshot"]
            initial["snapshot_script"] = script
        elif script in {e.name for e in self.examples} or script in self.root_scripts.paths:
            initial["script"] = script
        else:
            initial.update(script=PATH_CHOICE, script_path=script)
        roles = body.get("roles", {})
        if body.get("kvstore"):
            initial.update(
                kvstore=body["kvstore"],
                server_package=roles.get("server", {}).get("package"),
                servers=roles.get("server", {}).get("instances"),
                worker_package=roles.get("worker", {}).get("package"),
                workers=_fewest(roles.get("worker", {}).get("instances")),
                max_workers=_most(roles.get("worker", {}).get("instances")),
            )
        else:
            initial.update(
                package=roles.get("master", {}).get("package"),
                instances=sum(_fewest(r.get("instances", 0)) or 0 for r in roles.values()),
            )
            workers = roles.get("worker", {}).get("instances")
            if isinstance(workers, dict):
                initial["max_instances"] = 1 + workers["max"]
        if body.get("one_instance_per_node"):
            initial["one_instance_per_node"] = True
        if body.get("project"):
            initial["project"] = body["project"]
        if body.get("tags"):
            initial["tags"] = " ".join(body["tags"])
        if body.get("priority"):
            initial["priority"] = body["priority"]
        if body.get("pool"):
            initial["pool"] = body["pool"]
        for option, value in (body.get("slurm") or {}).items():
            initial[f"slurm_{option}"] = value
        restart = body.get("restart") or {}
        if restart:
            initial.update(
                restart_policy=restart.get("policy", ""),
                max_restarts=restart.get("max_restarts"),
                restart_backoff_seconds=restart.get("backoff_seconds"),
                exclude_failed_node=restart.get("exclude_failed_node", False),
                args_on_resume=shlex.join(restart.get("args_on_resume") or []),
            )
        if body.get("time_limit"):
            initial["time_limit"] = in_words(int(body["time_limit"]))
        if body.get("health_rules") and not image_health_rules:
            initial["health_rules"] = json.dumps(body["health_rules"])
        initial["env"] = "\n".join(f"{k}={v}" for k, v in (body.get("env") or {}).items())
        data = body.get("data") or []
        initial["data_folders"] = "\n".join([data] if isinstance(data, str) else data)
        initial["results_folder"] = body.get("results") or ""
        self.initial = initial

    def _slurm_choices(self) -> None:
        """Each Slurm option some pool lets a job choose, its values labelled with the pools
        that allow them; the others are not shown."""
        offered: dict[str, dict[str, list[str]]] = {option: {} for option in SLURM_FIELDS}
        exclusive = False
        for pool in SlurmPool.objects.filter(enabled=True):
            allowed = slurm_choices.allowed(pool)
            exclusive = exclusive or bool(allowed["exclusive"])
            for option in SLURM_FIELDS:
                for value in allowed[option]:  # type: ignore[attr-defined]
                    offered[option].setdefault(value, []).append(pool.name)
        for option, values in offered.items():
            if not values:
                del self.fields[f"slurm_{option}"]
                continue
            self._choices(
                f"slurm_{option}",
                [("", "the pool's")]
                + [
                    (value, f"{value} (pool {', '.join(pools)})") for value, pools in values.items()
                ],
            )
        if not exclusive:
            del self.fields["slurm_exclusive"]

    def _choices(self, name: str, choices: list[Any]) -> None:
        field = self.fields[name]
        assert isinstance(field, forms.ChoiceField)
        field.choices = choices

    def _program_menu(self) -> None:
        """The examples, the scripts under the code root and the user's uploads, in groups."""
        groups: list[tuple[str, list[tuple[str, str]]]] = [
            ("Built-in examples", [(e.name, e.name) for e in self.examples])
        ]
        if self.root_scripts.paths:
            more = "" if self.root_scripts.complete else ", the first ones"
            groups.append(
                (f"Scripts under the code root{more}", [(p, p) for p in self.root_scripts.paths])
            )
        if self.snapshots:
            groups.append(
                (
                    "Your uploaded code",
                    [(SNAPSHOT_CHOICE + s.sha256, s.label) for s in self.snapshots],
                )
            )
        groups.append(("Another script", [(PATH_CHOICE, "type a path under the code root…")]))
        self._choices("script", groups)
        root = settings.TRAINYARD_CODE_ROOT
        self.fields["script_path"].help_text = f"Relative to the code root, {root}."

    def snapshot_scripts(self) -> dict[str, dict[str, Any]]:
        """For the page's script: each upload's Python files and the one to preselect."""
        return {
            s.sha256: {"scripts": s.scripts, "entry_point": s.entry_point} for s in self.snapshots
        }

    def clean_args(self) -> list[str]:
        return _split_arguments(self.cleaned_data.get("args"))

    def clean_args_on_resume(self) -> list[str]:
        return _split_arguments(self.cleaned_data.get("args_on_resume"))

    def clean_health_rules(self) -> Any:
        return read_health_rules(self.cleaned_data.get("health_rules"))

    def clean_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for number, line in enumerate((self.cleaned_data.get("env") or "").splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, equals, value = line.partition("=")
            if not equals:
                raise forms.ValidationError(f"Line {number} is not NAME=value.")
            env[name.strip()] = value
        return env

    def as_request(self) -> dict[str, Any]:
        data = self.cleaned_data
        request: dict[str, Any] = {
            "name": data["name"],
            "image": data["image"],
            "program": {**self._program(), "args": data["args"]},
        }
        if data.get("container_image", "").strip():
            request["container_image"] = data["container_image"].strip()
        if data.get("restart_policy"):
            request["restart"] = {
                "policy": data["restart_policy"],
                "max_restarts": data["max_restarts"]
                if data["max_restarts"] is not None
                else RESTARTS_WHEN_ON_FAILURE,
                "backoff_seconds": data["restart_backoff_seconds"]
                if data["restart_backoff_seconds"] is not None
                else 10,
                "exclude_failed_node": bool(data.get("exclude_failed_node")),
            }
        if data.get("args_on_resume"):
            request.setdefault("restart", {})["args_on_resume"] = data["args_on_resume"]
        folders = (data.get("data_folders") or "").splitlines()
        if folders := [line.strip() for line in folders if line.strip()]:
            request["data"] = folders
        if data.get("results_folder", "").strip():
            request["results"] = data["results_folder"].strip()
        if data.get("one_instance_per_node"):
            request["one_instance_per_node"] = True
        if data.get("project", "").strip():
            request["project"] = data["project"].strip()
        if data.get("tags", "").strip():
            request["tags"] = data["tags"].replace(",", " ").split()
        if data.get("priority"):
            request["priority"] = data["priority"]
        if data.get("pool"):
            request["pool"] = data["pool"]
            chosen = {
                option: data[f"slurm_{option}"]
                for option in SLURM_FIELDS
                if data.get(f"slurm_{option}")
            }
            if data.get("slurm_exclusive"):
                chosen["exclusive"] = True
            if chosen:
                request["slurm"] = chosen
        if data.get("health_rules") is not None:
            request["health_rules"] = data["health_rules"]
        if data.get("env"):
            request["env"] = data["env"]
        if data.get("time_limit", "").strip():
            request["time_limit"] = data["time_limit"].strip()
        request["roles"] = roles_of(self.framework(), data)
        if self.framework() == Framework.KVSTORE:
            request["kvstore"] = data["kvstore"]
        return request

    def _program(self) -> dict[str, str]:
        choice = self.cleaned_data["script"]
        if choice == PATH_CHOICE:
            return {"script": self.cleaned_data["script_path"]}
        if choice.startswith(SNAPSHOT_CHOICE):
            return {
                "script": self.cleaned_data["snapshot_script"],
                "snapshot": choice.removeprefix(SNAPSHOT_CHOICE),
            }
        return {"script": choice}

    def add_service_errors(self, errors: dict[str, list[str]]) -> None:
        where = dict(
            PS_FIELD_FOR_ERROR if self.framework() == Framework.KVSTORE else FIELD_FOR_ERROR
        )
        # A script's error belongs beside the box it was typed in.
        choice = self.cleaned_data.get("script", "")
        if choice == PATH_CHOICE:
            where["program.script"] = "script_path"
        elif choice.startswith(SNAPSHOT_CHOICE):
            where["program.script"] = "snapshot_script"
            where["program.snapshot"] = "script"
        for field, messages in errors.items():
            for message in messages:
                self.add_error(_form_field(where, field), message)


def _form_field(where: dict[str, str], field: str) -> str | None:
    """The form field of a request field, or of the nearest one above it ("env.NAME" is
    `env`'s, "program.args.2" is `args`'); None: the form's own errors, at its top."""
    parts = field.split(".")
    while parts:
        if ".".join(parts) in where:
            return where[".".join(parts)]
        parts.pop()
    return None


class RetentionForm(forms.Form):
    """The job page's retention line: keep the job's log and metrics, or its own days."""

    keep = forms.BooleanField(required=False)
    days = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=36500,
        help_text="Days its log and metrics stay after it ends; empty: the default; 0: forever.",
    )


class JobShapeForm(_ShapeForm):
    """The New-job form's image, packages and counts alone, for its preview before Launch."""

    image = forms.CharField()
    package = forms.CharField(required=False)
    instances = forms.IntegerField(required=False, min_value=1)
    kvstore = forms.CharField(required=False)
    server_package = forms.CharField(required=False)
    servers = forms.IntegerField(required=False, min_value=1)
    worker_package = forms.CharField(required=False)
    workers = forms.IntegerField(required=False, min_value=1)
    args = forms.CharField(required=False, strip=False)
    one_instance_per_node = forms.BooleanField(required=False)

    # A preview is asked while the form is filled in: no mode yet means the default one.
    optional_fields = ("kvstore",)

    def clean_args(self) -> list[str]:
        """The arguments as far as they can be read so far: an unclosed quote while typing
        hides the batch size from the preview, it is not an error before Launch."""
        try:
            return shlex.split(self.cleaned_data.get("args") or "")
        except ValueError:
            return []

    def roles(self) -> dict[str, RoleIn]:
        return {
            role: RoleIn(**spec)
            for role, spec in roles_of(self.framework(), self.cleaned_data).items()
        }

    def field_errors(self, errors: dict[str, list[str]]) -> dict[str, list[str]]:
        """The services' errors by request field, as the form's fields they belong to (the
        master's and the workers' one package: one message)."""
        where = PS_FIELD_FOR_ERROR if self.framework() == Framework.KVSTORE else FIELD_FOR_ERROR
        by_field: dict[str, list[str]] = {}
        for field, messages in errors.items():
            shown = by_field.setdefault(_form_field(where, field) or "__all__", [])
            shown.extend(m for m in messages if m not in shown)
        return by_field


def _split_arguments(text: str | None) -> list[str]:
    """Arguments as a shell would split them, never run through one."""
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise forms.ValidationError(f"Could not split the arguments: {exc}.") from None
