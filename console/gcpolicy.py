"""How the console's long-running processes use Python's cyclic garbage collector.

A web process and a console worker build most of what they keep while starting: Django's
models, URL patterns, templates, every module. With the collector's defaults, a full
collection every few requests walks all of it again: in a web process with 100,000 jobs in
history that was a ~100 ms pause about once in eleven requests, which made the job list's p99
five times its p50 (issue 24). So once a process has started, what it holds is moved out of
the collector's way (gc.freeze) and the collector runs less often: after 50,000 new objects
instead of 700, which lets a request's short-lived cycles pile up for a few MB at most before
they are collected. Reference counting still frees everything else at once.
"""

import gc

# Objects allocated (less those freed) before a young collection; how many young collections
# before a middle one, and middle ones before a full one (gc.set_threshold).
THRESHOLDS = (50_000, 20, 20)


def settle() -> None:
    """Call once the process has started and before it serves: collects what starting left
    behind, freezes the rest, and sets the thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
