"""Keeps N processes busy for S seconds: a neighbour that takes more cores than it was given.

python spin.py N SECONDS
"""

import os
import sys
import time

count, seconds = int(sys.argv[1]), float(sys.argv[2])
until = time.monotonic() + seconds
print(f"spinning {count} processes", flush=True)
for _ in range(count - 1):
    if os.fork() == 0:
        break
while time.monotonic() < until:
    pass
