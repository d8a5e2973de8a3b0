"""Print LINES log lines as fast as print() goes, each with its sequence number and print time.

    python -u flood.py LINES [DELAY]

Every line is `seq=<n> t=<time.time()> ...`, so a reader can count lost and duplicated lines
and tell when the first one was printed. The rest of the line is the size and shape of a
typical training log line. DELAY seconds of sleep first give a log follower time to attach.
"""

import sys
import time


def main() -> None:
    lines = int(sys.argv[1])
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
    for n in range(lines):
        print(f"seq={n} t={time.time():.6f} step={n} loss={0.5 + (n % 97) / 1000:.4f} lr=3.0e-04")


if __name__ == "__main__":
    main()
