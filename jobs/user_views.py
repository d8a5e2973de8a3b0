"""The admins' Users page: every user with their groups and quota, a form to add one, and
forms to change a user's groups, staff status and quota, or a group's quota. Thin views over
jobs.services.users."""

from django.contrib import messages
from django.contrib.auth.models import Group, User
from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache

from jobs.access import staff_required
from jobs.account_forms import EditUserForm, GroupQuotaForm, NewUserForm
from jobs.services import users


@never_cache  # the page may hold a generated password
@staff_required
def user_list(request: HttpRequest) -> HttpResponse:
    form = NewUserForm(request.POST if request.method == "POST" else None)
    created: dict[str, str] | None = None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        password = data["password"] or users.generate_password()
        try:
            user = users.create_user(
                data["username"],
                password,
                email=data["email"],
                groups=data["groups"],
                new_group=data["new_group"],
                is_staff=data["is_staff"],
                quota=form.limits(),
            )
        except IntegrityError:  # the same name, added by another request since the check
            form.add_error("username", f"A user named {data['username']!r} exists already.")
        else:
            if data["password"]:
                messages.success(request, f"Added {user.username}.")
                return redirect("user_list")
            # A generated password is shown in this response only: never in a URL or session.
            created = {"username": user.username, "password": password}
            form = NewUserForm()
    context = {
        "form": form,
        "created": created,
        "rows": users.user_rows(),
        "groups": users.group_rows(),
    }
    return render(request, "account/users.html", context)


@staff_required
def user_edit(request: HttpRequest, user_id: int) -> HttpResponse:
    user = get_object_or_404(User, pk=user_id)
    editor: User = request.user  # type: ignore[assignment]  # staff_required
    form = EditUserForm(
        request.POST if request.method == "POST" else None, user=user, editor=editor
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        users.update_user(
            user,
            groups=data["groups"],
            new_group=data["new_group"],
            is_staff=data["is_staff"],
            is_active=data["is_active"],
            quota=form.limits(),
        )
        messages.success(request, f"Saved {user.username}.")
        return redirect("user_list")
    return render(request, "account/user_edit.html", {"form": form, "subject": user})


@staff_required
def group_edit(request: HttpRequest, group_id: int) -> HttpResponse:
    group = get_object_or_404(Group, pk=group_id)
    form = GroupQuotaForm(request.POST if request.method == "POST" else None, group=group)
    if request.method == "POST" and form.is_valid():
        users.set_group_quota(group, form.limits(), form.cleaned_data.get("default_time_limit"))
        messages.success(request, f"Saved the quota of group {group.name}.")
        return redirect("user_list")
    members = group.user_set.order_by("username")
    return render(
        request, "account/group_edit.html", {"form": form, "group": group, "members": members}
    )
