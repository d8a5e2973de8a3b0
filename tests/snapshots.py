"""A folder as the console's code snapshot of it: packed by the CLI (what a user uploads) and
repacked canonically by workers.snapshot (what the console stores and agents fetch)."""

import io
from pathlib import Path

from trainyard_cli.upload import pack
from workers.snapshot import Packed, canonical


def snapshot_of(folder: Path) -> Packed:
    return canonical(io.BytesIO(pack(folder).archive))
