"""Content-Security-Policy on every response (Django 5.2 has no setting for it).

The pages load every script and style sheet from /static/ and hand data to scripts through
`json_script` blocks (type="application/json", which CSP does not treat as script), so the
policy allows no inline script or style at all: an injected <script> or on…= handler does not
run. The policy lives in settings.SECURE_CSP, a mapping of directive to sources shaped like
Django 6.0's setting of that name, so that its own middleware can take over on upgrade.

The other headers come from Django's own middleware, configured in console/settings.py:
X-Content-Type-Options, Referrer-Policy and Cross-Origin-Opener-Policy from SecurityMiddleware,
X-Frame-Options from XFrameOptionsMiddleware.
"""

from collections.abc import Callable, Mapping, Sequence

from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase

HEADER = "Content-Security-Policy"


def policy_header(policy: Mapping[str, Sequence[str]]) -> str:
    """{"default-src": ["'self'"], "upgrade-insecure-requests": []} →
    "default-src 'self'; upgrade-insecure-requests"."""
    return "; ".join(" ".join([directive, *sources]) for directive, sources in policy.items())


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        policy = getattr(settings, "SECURE_CSP", None)
        # A view that sets its own policy keeps it.
        if policy and HEADER not in response:
            response[HEADER] = policy_header(policy)
        return response
