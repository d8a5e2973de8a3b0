"""The New job form: turns its fields into the same request dict the API takes."""

import shlex
from typing import Any

from django import forms
from django.conf import settings

from jobs.models import FrameworkImage, Package
from workers.programs import BUILTIN_EXAMPLES

PATH_CHOICE = "__path__"

# Which form field shows an error the services report for a request field.
FIELD_FOR_ERROR = {
    "name": "name",
    "image": "image",
    "program": "script",
    "program.script": "script",
    "program.args": "args",
    "roles.master.package": "package",
    "roles.worker.package": "package",
    "roles.master.instances": "instances",
    "roles.worker.instances": "instances",
}


class NewJobForm(forms.Form):
    name = forms.CharField(max_length=200)
    image = forms.ChoiceField()
    script = forms.ChoiceField(label="Training program")
    script_path = forms.CharField(
        required=False, label="Script path", help_text="Relative to the code root."
    )
    args = forms.CharField(
        required=False,
        label="Arguments",
        help_text="Split like a shell would, but never run through one.",
    )
    package = forms.ChoiceField(label="Resource package")
    instances = forms.IntegerField(
        min_value=1, initial=2, help_text="Instance 0 is [master], the rest [worker-1], ..."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        images = FrameworkImage.objects.filter(enabled=True)
        self._choices("image", [(i.name, i.name) for i in images])
        self._choices(
            "script",
            [
                *((name, f"example: {name}") for name in BUILTIN_EXAMPLES),
                (PATH_CHOICE, "a script under the code root…"),
            ],
        )
        packages = Package.objects.filter(enabled=True)
        self._choices("package", [(p.name, f"{p.name} — {p.summary}") for p in packages])
        instances = self.fields["instances"]
        assert isinstance(instances, forms.IntegerField)
        instances.max_value = settings.TRAINYARD_MAX_INSTANCES
        instances.widget.attrs["max"] = settings.TRAINYARD_MAX_INSTANCES

    def _choices(self, name: str, choices: list[tuple[str, str]]) -> None:
        field = self.fields[name]
        assert isinstance(field, forms.ChoiceField)
        field.choices = choices

    def clean_args(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data.get("args") or "")
        except ValueError as exc:
            raise forms.ValidationError(f"Could not split the arguments: {exc}.") from None

    def as_request(self) -> dict[str, Any]:
        data = self.cleaned_data
        script = data["script_path"] if data["script"] == PATH_CHOICE else data["script"]
        roles: dict[str, Any] = {"master": {"package": data["package"], "instances": 1}}
        if data["instances"] > 1:
            roles["worker"] = {"package": data["package"], "instances": data["instances"] - 1}
        return {
            "name": data["name"],
            "image": data["image"],
            "program": {"script": script, "args": data["args"]},
            "roles": roles,
        }

    def add_service_errors(self, errors: dict[str, list[str]]) -> None:
        for field, messages in errors.items():
            for message in messages:
                self.add_error(FIELD_FOR_ERROR.get(field), message)
