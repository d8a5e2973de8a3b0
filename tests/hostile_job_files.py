"""Job files the `trainyard` command must refuse with exit 2 and the line and column, before it
uploads anything: shared by tests/unit/test_cli.py and tests/integration/test_cli.py."""


def billion_laughs(levels: int = 9) -> str:
    """A YAML alias bomb: a few lines that stand for 10^(levels-1) strings."""
    lines = ['l0: &l0 "lol"']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + f"\nprogram: {{script: train.py, args: *l{levels - 1}}}\n"


# (id, the job file's bytes, what the message says, where)
UNUSABLE_JOB_FILES = [
    ("lone-surrogate", b'name: "run\\ud800"\n', "U+D800 is not text", (1, 7)),
    ("nul-escape", b'image: ok\nname: "a\\0b"\n', "U+0000 is not text", (2, 7)),
    ("invalid-utf8", b"name: ok\nimage: caf\xe9\n", "is not UTF-8 text", (2, 11)),
    ("raw-control", b"name: ok\nimage: a\x1bb\n", "U+001B is not allowed", (2, 9)),
    ("alias-bomb", billion_laughs().encode(), "expands to more than 100,000 values", (6, 5)),
    ("alias-cycle", b"name: x\nargs: &a [1, *a]\n", "contains itself", (2, 7)),
]
