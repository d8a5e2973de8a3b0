"""The logged-in user's own account pages: their profile, their API tokens and their
password. Thin views over jobs.services.identity, .tokens and .users."""

from django.contrib import messages
from django.contrib.auth import update_session_auth_hash
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from jobs.account_forms import ChangePasswordForm, NewTokenForm
from jobs.services import identity, tokens, users


@login_required
def profile(request: HttpRequest) -> HttpResponse:
    user: User = request.user  # type: ignore[assignment]  # login_required
    return render(request, "account/profile.html", {"profile": identity.profile_of(user)})


@never_cache  # the page may hold a new key: no cache keeps a copy
@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    user: User = request.user  # type: ignore[assignment]  # login_required
    form = NewTokenForm(request.POST if request.method == "POST" else None)
    issued = None
    if request.method == "POST" and form.is_valid():
        try:
            issued = tokens.issue(user, form.cleaned_data["name"])
        except tokens.BadTokenName as exc:
            form.add_error("name", str(exc))
        else:
            # Rendered, not redirected: the key exists only in this response, and must not
            # travel in a URL or a session.
            form = NewTokenForm()
    context = {
        "form": form,
        "issued": issued,
        "tokens": tokens.tokens_of(user),
        "site_url": request.build_absolute_uri("/").rstrip("/"),
    }
    return render(request, "account/tokens.html", context)


@require_POST
@login_required
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    revoked = tokens.revoke(request.user, token_id)  # type: ignore[arg-type]  # login_required
    if revoked is None:
        raise Http404("You have no token with that id.")
    label = revoked.name or f"{revoked.prefix}…"
    messages.success(request, f"Revoked token {label}: it no longer works.")
    return redirect("token_list")


@never_cache
@login_required
def password_change(request: HttpRequest) -> HttpResponse:
    user: User = request.user  # type: ignore[assignment]  # login_required
    form = ChangePasswordForm(user, request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        keep = bool(form.cleaned_data["keep_tokens"])
        revoked = users.change_password(user, form.cleaned_data["new_password1"], keep)
        # This browser stays logged in; every other session of theirs has ended.
        update_session_auth_hash(request, user)
        if keep:
            outcome = "Your API tokens still work."
        else:
            outcome = (
                f"Your API tokens ({revoked}) were revoked: make new ones where you need them."
            )
        messages.success(request, f"Password changed. Your other sessions have ended. {outcome}")
        return redirect("password_change")
    return render(request, "account/password.html", {"form": form})
