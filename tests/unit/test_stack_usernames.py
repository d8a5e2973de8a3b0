"""The integration and browser tests share one stack per process, and pytest-xdist deals them
out in an order that changes from run to run. Two tests that create the same user would pass
alone and collide only when the same process draws both (a CI run failed that way), so each
name a test gives `create_user` must be its own."""

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _usernames_created() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "create_user" or not node.args:
                continue
            # `User.objects.create_user` in a unit test writes to that test's own database.
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "objects":
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                where[first.value].append(f"{path.relative_to(TESTS)}:{node.lineno}")
    return where


def test_the_scan_finds_the_users_the_stack_tests_create() -> None:
    # Guards the scan itself: if the helper were renamed, the check below would pass on nothing.
    assert len(_usernames_created()) >= 20


def test_no_two_tests_create_the_same_user_on_the_shared_stack() -> None:
    reused = {name: places for name, places in _usernames_created().items() if len(places) > 1}
    assert reused == {}
