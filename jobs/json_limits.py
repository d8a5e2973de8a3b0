"""JSON that a user sends, read without letting its shape hurt the server.

`json.loads` recurses once per level of nesting and raises RecursionError near 1,000 levels,
which a view would answer with a 500. No request of Trainyard's nests deeper than a handful of
levels, so the API's bodies and the New-job form's JSON fields (health rules) are refused past
MAX_JSON_DEPTH, measured before anything is parsed.
"""

import json
from typing import Any

MAX_JSON_DEPTH = 32


class TooDeep(ValueError):
    def __init__(self) -> None:
        super().__init__(f"nested too deeply (more than {MAX_JSON_DEPTH} levels)")


def bracket_depth(raw: bytes) -> int:
    """How deep [ and { nest, outside strings: measured without parsing, so that a hostile
    body costs one pass over its bytes."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def loads(raw: bytes | str) -> Any:
    """`json.loads(raw)`, raising TooDeep (a ValueError) for what nests past MAX_JSON_DEPTH
    and ValueError (or UnicodeDecodeError) for what is not JSON."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    # Counting brackets is C-speed; only a body with enough of them is walked byte by byte.
    brackets = data.count(b"[") + data.count(b"{")
    if brackets > MAX_JSON_DEPTH and bracket_depth(data) > MAX_JSON_DEPTH:
        raise TooDeep
    try:
        return json.loads(data)
    except RecursionError:
        raise TooDeep from None
