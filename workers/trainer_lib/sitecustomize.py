"""Run by Python at start-up in every trainer (the agent puts this folder first on PYTHONPATH).

It makes stdout line-buffered, as on a terminal: each line reaches the log as soon as it is
printed, in one write, without the cost of `python -u` (which writes a print's text and its
newline separately, two system calls per line). stderr is line-buffered already.

A sitecustomize this one shadows (an image's own) still runs, right after.
"""

import importlib.util
import os
import sys


def _line_buffered() -> None:
    try:
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    except (AttributeError, ValueError):  # replaced or closed stdout: leave it be
        pass


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.curdir)
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder == here or not os.path.isfile(candidate):
            continue
        spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        return


_line_buffered()
_run_shadowed()
