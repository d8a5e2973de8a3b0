"""What the console takes as text: the one place of the rules every string must keep.

Two rules, because text goes two places:
- Anything (a variable's value, an argument, a pattern, a description) must be text that a
  process argument, an environment variable and the database can hold: no NUL (C strings end
  there, PostgreSQL refuses it) and no lone UTF-16 surrogate (JSON's "\\ud800" escape decodes
  to one; it has no UTF-8 form, so it fails the moment it is written to a file, a pipe or a
  socket, long after the request was accepted).
- A name (a job's, a token's, a group's, an upload's) is shown to other people in lists, so it
  must also be visible as what it is: no control characters (a newline forges a second line in
  a log or a table) and no invisible format characters, the bidirectional overrides among them
  (U+202E turns "job-exe.txt" into what reads as "job-txt.exe").

Text stored before these rules still has to be shown: `shown` makes any string safe to put in
a page.
"""

import re
import unicodedata
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import ValidationError

# Categories refused in names: controls (Cc), format characters (Cf: bidi embeddings and
# overrides, isolates, zero-width joiners, the BOM), surrogates (Cs), line and paragraph
# separators (Zl, Zp).
_NOT_IN_NAMES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Why `value` cannot be taken as text, in words; None when it can."""
    if "\x00" in value:
        return "Text may not contain the NUL character (\\u0000)."
    surrogate = _SURROGATE.search(value)
    if surrogate:
        return (
            f"Text may not contain a lone UTF-16 surrogate (\\u{ord(surrogate.group()):04x}); "
            "send the character itself, or both halves of its pair."
        )
    return None


def name_problem(value: str) -> str | None:
    """Why `value` cannot be a name, in words; None when it can."""
    problem = text_problem(value)
    if problem:
        return problem
    for char in value:
        if unicodedata.category(char) in _NOT_IN_NAMES:
            what = unicodedata.name(char, "a control character")
            return (
                f"A name may not contain invisible or control characters "
                f"(U+{ord(char):04X}, {what.lower()})."
            )
    return None


def find_text_problems(data: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """(field path, problem) for every string in parsed JSON that is not text, keys included:
    the whole body is checked before any field is looked at, so no check of meaning, lookup
    or write ever sees such a string."""
    if isinstance(data, str):
        problem = text_problem(data)
        if problem:
            yield ".".join(path) or "request", problem
    elif isinstance(data, dict):
        for key, value in data.items():
            key_text = str(key)
            problem = text_problem(key_text)
            if problem:
                yield ".".join((*path, shown_key(key_text))), f"A key: {problem}"
            yield from find_text_problems(value, (*path, shown_key(key_text)))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            yield from find_text_problems(item, (*path, str(index)))


def problems_by_field(data: Any) -> dict[str, list[str]]:
    """find_text_problems in the form of a refusal's errors: {field: [problem, ...]}."""
    problems: dict[str, list[str]] = {}
    for field, problem in find_text_problems(data):
        problems.setdefault(field, []).append(problem)
    return problems


def shown(value: str) -> str:
    """`value` fit to put in a page or an answer: a lone surrogate (only in text stored before
    the rules above) becomes U+FFFD, the replacement character, instead of failing the page."""
    if _SURROGATE.search(value) is None:
        return value  # the same object: callers may tell that nothing changed
    return _SURROGATE.sub("\ufffd", value)


def shown_key(value: str) -> str:
    """A key (of a JSON body or a query string) as it can be named in a message."""
    return shown(value).replace("\x00", "\\u0000")


def validate_name(value: str) -> None:
    """A form field's validator for names."""
    problem = name_problem(value)
    if problem:
        raise ValidationError(problem, code="invalid_name")
