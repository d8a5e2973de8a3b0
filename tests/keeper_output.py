"""Reading a keeper's output file back, for tests: what the agent ships from it, by stream."""

from pathlib import Path

from workers.keeper import read_frames


def read_output(path: Path) -> dict[str, bytes]:
    """A rank's output file, by stream: {"out": stdout's bytes, "err": stderr's}."""
    frames, _ = read_frames(path.read_bytes())
    out = {"out": b"", "err": b""}
    for stream, data, _, _ in frames:
        out[stream] += data
    return out
