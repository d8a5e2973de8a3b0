"""The node's image cache (workers/images.py) around a stand-in podman: which images a prune
removes, and what a pull that fails leaves in the reason. The real engine's pulls and missing
images run in tests/integration/test_containers.py."""

import json
import sys
import time
from pathlib import Path

import pytest

from workers import containers, images

STAND_IN = """#!{python}
import json, sys
state = json.load(open({state!r}))
args = sys.argv[1:]
with open({calls!r}, "a") as calls:
    calls.write(json.dumps(args) + "\\n")
if args[:2] == ["image", "exists"]:
    sys.exit(0 if args[2] in state["sizes"] else 1)
if args[:2] == ["image", "inspect"]:
    if args[-1] not in state["sizes"]:
        sys.exit(125)
    print(state["sizes"][args[-1]])
elif args[0] == "rmi":
    sys.exit(0)
elif args[0] == "pull":
    print(state["pull_error"], file=sys.stderr)
    sys.exit(125)
"""


def stand_in(tmp_path: Path, sizes: dict[str, int], pull_error: str = "") -> tuple[Path, Path]:
    folder = tmp_path / "bin"
    folder.mkdir()
    state, calls = tmp_path / "state.json", tmp_path / "calls.log"
    state.write_text(json.dumps({"sizes": sizes, "pull_error": pull_error}))
    runtime = folder / "podman"  # podman's own verbs (image exists)
    runtime.write_text(STAND_IN.format(python=sys.executable, state=str(state), calls=str(calls)))
    runtime.chmod(0o755)
    return runtime, calls


def removed_by(calls: Path) -> list[str]:
    lines = [json.loads(line) for line in calls.read_text().splitlines()]
    return [c[1] for c in lines if c[0] == "rmi"]


def test_a_prune_removes_the_least_recently_used_until_the_cache_fits(tmp_path: Path) -> None:
    mb = 1 << 20
    refs = [
        "localhost/built:1",
        "reg.example.com/a:1",
        "reg.example.com/b:1",
        "reg.example.com/c:1",
    ]
    runtime, calls = stand_in(tmp_path, {r: 40 * mb for r in refs})
    record = tmp_path / "images.json"
    now = time.time()
    record.write_text(json.dumps({r: now - 100 + i for i, r in enumerate(refs)}))
    cache = images.ImageCache(containers.Runtime(str(runtime)), "node-1", record, 50 * mb)
    # Oldest first: the local-only image stays (no registry gives it back), a goes, b is in
    # use, c goes; the 80 MB left (b and the local one) are more than 50, but neither may go.
    assert cache.prune(in_use={"reg.example.com/b:1"}) == [refs[1], refs[3]]
    assert removed_by(calls) == [refs[1], refs[3]]
    assert sorted(json.loads(record.read_text())) == [refs[0], refs[2]]


def test_a_prune_within_the_limit_removes_nothing(tmp_path: Path) -> None:
    runtime, calls = stand_in(tmp_path, {"reg.example.com/a:1": 10})
    record = tmp_path / "images.json"
    record.write_text(json.dumps({"reg.example.com/a:1": time.time()}))
    cache = images.ImageCache(containers.Runtime(str(runtime)), "node-1", record, 10)
    assert cache.prune(in_use=set()) == []
    assert removed_by(calls) == []


def test_a_failed_pull_names_the_image_the_node_and_the_runtimes_words(tmp_path: Path) -> None:
    said = "Error: initializing source docker://reg.example.com/x:1: connection refused"
    runtime, _ = stand_in(tmp_path, {}, pull_error=said)
    notes: list[str] = []
    cache = images.ImageCache(containers.Runtime(str(runtime)), "node-3", tmp_path / "i.json", 1)
    with pytest.raises(images.ImageMissing) as failed:
        cache.ensure("reg.example.com/x:1", notes.append)
    assert str(failed.value) == f"image reg.example.com/x:1 not found on node-3: {said}"
    assert notes == ["pulling image reg.example.com/x:1 on node-3"]
    assert not (tmp_path / "i.json").exists()  # nothing recorded for an image never had
