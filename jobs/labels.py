"""The rules for what a user files a run under (issue 49): tags, a project and a note.

Tags and projects are shown in lists, typed on the command line as `trainyard tag JOB +a -b`
and put in query strings (`?tag=`, `?project=`), so they are short words of a few safe
characters: no spaces, nothing a shell or a URL would read otherwise, and never starting with
"+" or "-" (the CLI's add/remove signs). A note is free text, shown as text, of bounded length.
"""

import re

from django.core.exceptions import ValidationError

from jobs.text import text_problem

TAG_MAX = 40
TAGS_PER_JOB = 20
PROJECT_MAX = 100
NOTE_MAX = 2000

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/=-]*")
_LABEL_CHARACTERS = "letters, digits and _ . : / = - (starting with a letter or a digit)"


def tag_problem(value: str) -> str | None:
    """Why `value` cannot be a tag, in words; None when it can."""
    if not value:
        return "A tag may not be empty."
    if len(value) > TAG_MAX:
        return f"A tag is at most {TAG_MAX} characters; {value[:TAG_MAX]!r}… is {len(value)}."
    if not _LABEL.fullmatch(value):
        return f"A tag is {_LABEL_CHARACTERS}; not {value!r}."
    return None


def project_problem(value: str) -> str | None:
    """Why `value` cannot be a project's name, in words; None when it can ("" is no project)."""
    if len(value) > PROJECT_MAX:
        return f"A project's name is at most {PROJECT_MAX} characters."
    if value and not _LABEL.fullmatch(value):
        return f"A project's name is {_LABEL_CHARACTERS}; not {value!r}."
    return None


def note_problem(value: str) -> str | None:
    """Why `value` cannot be a note, in words; None when it can."""
    if len(value) > NOTE_MAX:
        return f"A note is at most {NOTE_MAX} characters; this one is {len(value)}."
    return text_problem(value)


def validate_tag(value: str) -> None:
    if problem := tag_problem(value):
        raise ValidationError(problem, code="invalid_tag")


def validate_project(value: str) -> None:
    if problem := project_problem(value):
        raise ValidationError(problem, code="invalid_project")


def validate_note(value: str) -> None:
    if problem := note_problem(value):
        raise ValidationError(problem, code="invalid_note")
