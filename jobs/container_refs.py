"""Container image references that users bring: well-formed, and inside what an admin allows.

A reference goes to the node's container runtime as one argument after its options, so one
that is not an OCI reference (a leading "-", a space, a shell character) is refused here,
never handed on. The grammar is the distribution project's (docker/distribution's
`reference` package): `[domain[:port]/]path[:tag][@digest]`, lower-case path components.

The allow-list is an image's `user_image_prefixes`: a prefix matches at a boundary of the
reference ("registry.example.com/team-a" allows "registry.example.com/team-a/bert:1" and
"registry.example.com/team-a:2", never "registry.example.com/team-ab/x").
"""

import re

MAX_REFERENCE_LENGTH = 255  # distribution's limit on a name; the model field holds 300

_DOMAIN_PART = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)"
_DOMAIN = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII
)
# Where a prefix may end inside a reference: before a path component, a tag or a digest.
_BOUNDARIES = "/:@"


def reference_problem(reference: str) -> str | None:
    """Why `reference` is not an image reference to hand to a runtime; None when it is one."""
    if not reference:
        return "Give an image reference, e.g. registry.example.com/team/trainer:1.0."
    if len(reference) > MAX_REFERENCE_LENGTH:
        return f"An image reference has at most {MAX_REFERENCE_LENGTH} characters."
    if not _REFERENCE.fullmatch(reference):
        return (
            f"{reference!r} is not an image reference: [registry[:port]/]path[:tag][@digest], "
            "with a lower-case path, e.g. registry.example.com/team/trainer:1.0."
        )
    return None


def prefix_problem(prefix: object) -> str | None:
    """Why an admin's allow-list entry cannot be one; None when it can."""
    if not isinstance(prefix, str) or not prefix.strip():
        return "Each allowed prefix is a non-empty text, e.g. registry.example.com/team-a/."
    if prefix != prefix.strip() or any(c.isspace() for c in prefix) or prefix.startswith("-"):
        return f"{prefix!r}: a prefix has no spaces and does not start with '-'."
    return None


def allowed_by(reference: str, prefixes: list[str]) -> bool:
    """Whether one of `prefixes` allows `reference`, matching at a boundary only."""
    for prefix in prefixes:
        if not reference.startswith(prefix):
            continue
        rest = reference[len(prefix) :]
        if not rest or prefix[-1] in _BOUNDARIES or rest[0] in _BOUNDARIES:
            return True
    return False
