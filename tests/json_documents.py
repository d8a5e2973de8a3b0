"""Walking and changing JSON documents, for tests that send every variation of a request."""

import copy
from collections.abc import Iterator
from typing import Any


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value inside a JSON document (not the document's own, the empty path)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*prefix, key)
            yield from paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield (*prefix, i)
            yield from paths(inner, (*prefix, i))


def replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of `document` with the value at `path` replaced (the empty path: `value`)."""
    if not path:
        return value
    changed = copy.deepcopy(document)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


def removed(document: Any, path: tuple[Any, ...]) -> Any:
    """A copy of `document` without the value at `path`."""
    changed = copy.deepcopy(document)
    target = changed
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return changed
