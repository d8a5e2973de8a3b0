"""Forms of the API tokens and password pages and the admins' Users page. They only
validate; the writes are jobs.services.tokens and jobs.services.users."""

from typing import Any

from django import forms
from django.contrib.auth import password_validation
from django.contrib.auth.forms import AdminPasswordChangeForm, PasswordChangeForm, UsernameField
from django.contrib.auth.models import Group, User
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError

from jobs.models import Quota
from jobs.services.tokens import NAME_MAX_LENGTH
from jobs.services.users import Limits, change_password
from jobs.text import validate_name
from jobs.time_limit_text import BadTimeLimit, in_words, parse


class NewTokenForm(forms.Form):
    name = forms.CharField(
        max_length=NAME_MAX_LENGTH,
        validators=[validate_name],
        help_text="Where you will use it, e.g. laptop or nightly-eval, so that you know "
        "which one to revoke.",
        widget=forms.TextInput(attrs={"placeholder": "laptop", "autocomplete": "off"}),
    )


KEEP_TOKENS_HELP = (
    "Unticked (the default), every API token stops working and every stream opened with one "
    "closes: if the password leaked, a token made with it may have too."
)


def keep_tokens_field(label: str) -> forms.BooleanField:
    return forms.BooleanField(
        required=False, initial=False, label=label, help_text=KEEP_TOKENS_HELP
    )


class ChangePasswordForm(PasswordChangeForm):
    """Django's own (old password, new twice, the password validators), and whether to keep
    the API tokens."""

    keep_tokens = keep_tokens_field("Keep my API tokens working")


class AdminChangePasswordForm(AdminPasswordChangeForm):
    """The admin's "change password" of another user, with the same choice for their tokens.
    Saving goes through jobs.services.users.change_password, as on the user's own page."""

    keep_tokens = keep_tokens_field("Keep their API tokens working")

    def save(self, commit: bool = True) -> Any:
        if not commit:
            return super().save(commit=False)
        usable = self.cleaned_data.get("usable_password", "true") != "false"
        password = self.cleaned_data.get("password1") if usable else None
        change_password(self.user, password, keep_tokens=bool(self.cleaned_data["keep_tokens"]))
        return self.user


class QuotaFields(forms.Form):
    """A quota's four limits, asked for only when `own_quota` is ticked."""

    own_quota = forms.BooleanField(required=False, label="A quota of their own")
    cpu = forms.IntegerField(required=False, min_value=0, label="CPU cores")
    gpus = forms.IntegerField(required=False, min_value=0, label="GPUs")
    memory_gb = forms.IntegerField(required=False, min_value=0, label="Memory GB")
    running_jobs = forms.IntegerField(
        required=False, min_value=0, label="Jobs", help_text="queued or running at once"
    )

    LIMITS = ("cpu", "gpus", "memory_gb", "running_jobs")

    def __init__(self, *args: Any, quota: Quota | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The current limits, or the default's as a starting point.
        start = quota or Quota.objects.filter(is_default=True).first()
        if start is not None:
            for name in self.LIMITS:
                self.fields[name].initial = getattr(start, name)
        self.fields["own_quota"].initial = quota is not None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("own_quota"):
            for name in self.LIMITS:
                if data.get(name) is None and name not in self.errors:
                    self.add_error(name, "Give every limit of the quota (0 for none).")
        return data

    def limits(self) -> Limits | None:
        """The quota asked for; None: no quota of its own (the default applies)."""
        data = self.cleaned_data
        if not data.get("own_quota"):
            return None
        return Limits(*(int(data[name]) for name in self.LIMITS))


class GroupsFields(forms.Form):
    groups = forms.ModelMultipleChoiceField(
        queryset=Group.objects.order_by("name"),
        required=False,
        label="Existing groups",
        widget=forms.CheckboxSelectMultiple,
    )
    new_group = forms.CharField(
        required=False,
        max_length=Group._meta.get_field("name").max_length,
        validators=[validate_name],
        label="New group",
        help_text="Created, and the user put in it; an existing name is that group.",
    )

    def clean_new_group(self) -> str:
        return str(self.cleaned_data.get("new_group") or "").strip()


class NewUserForm(GroupsFields, QuotaFields):
    username = UsernameField(
        max_length=User._meta.get_field("username").max_length,
        validators=[UnicodeUsernameValidator()],
        help_text=User._meta.get_field("username").help_text,
        widget=forms.TextInput(attrs={"autocomplete": "off"}),
    )
    password = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="Leave empty to generate one; it is shown once, after you add the user.",
    )
    email = forms.EmailField(required=False, label="Email (optional)")
    is_staff = forms.BooleanField(
        required=False, label="Staff: may use the Users page, the admin and see every job"
    )

    field_order = ["username", "password", "email", "groups", "new_group", "is_staff"]

    def clean_username(self) -> str:
        username = str(self.cleaned_data["username"])
        if User.objects.filter(username__iexact=username).exists():
            raise ValidationError(f"A user named {username!r} exists already.")
        return username

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        password = data.get("password")
        if password:
            candidate = User(username=data.get("username", ""), email=data.get("email", ""))
            try:
                password_validation.validate_password(password, candidate)
            except ValidationError as exc:
                self.add_error("password", exc)
        return data


class EditUserForm(GroupsFields, QuotaFields):
    is_staff = NewUserForm.base_fields["is_staff"]
    is_active = forms.BooleanField(
        required=False, label="Active: may log in and use their API tokens"
    )

    field_order = ["groups", "new_group", "is_staff", "is_active"]

    def __init__(self, *args: Any, user: User, editor: User, **kwargs: Any) -> None:
        super().__init__(*args, quota=Quota.objects.filter(user=user).first(), **kwargs)
        self.user, self.editor = user, editor
        self.fields["groups"].initial = list(user.groups.all())
        self.fields["is_staff"].initial = user.is_staff
        self.fields["is_active"].initial = user.is_active

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        # An admin who locks themselves out needs another admin to undo it.
        if self.user.pk == self.editor.pk:
            if not data.get("is_staff"):
                self.add_error("is_staff", "You cannot take away your own staff status.")
            if not data.get("is_active"):
                self.add_error("is_active", "You cannot deactivate yourself.")
        return data


class GroupQuotaForm(QuotaFields):
    default_time_limit = forms.CharField(
        required=False,
        max_length=40,
        label="Default time limit",
        help_text='For members\' jobs that set none: "4h", "90m", "1h30m" or seconds; with '
        "several groups, the shortest applies. Empty: none (the console's default, if any). "
        "Kept with the group's quota.",
    )

    def __init__(self, *args: Any, group: Group, **kwargs: Any) -> None:
        quota = Quota.objects.filter(group=group).first()
        super().__init__(*args, quota=quota, **kwargs)
        self.fields["own_quota"].label = "A quota for the group (shared by its members)"
        if quota is not None and quota.default_time_limit:
            self.fields["default_time_limit"].initial = in_words(quota.default_time_limit)

    def clean_default_time_limit(self) -> int | None:
        try:
            return parse(self.cleaned_data.get("default_time_limit") or None)
        except BadTimeLimit as exc:
            raise forms.ValidationError(str(exc)) from None
