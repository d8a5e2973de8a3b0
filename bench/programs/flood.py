"""Print LINES log lines as fast as print() goes, each with its sequence number and print time.

    python flood.py LINES [DELAY] [BULK]

Every line is `seq=<n> t=<time.time()> ...`, so a reader can count lost and duplicated lines
and tell when the first one was printed. The rest of the line is the size and shape of a
typical training log line. DELAY seconds of sleep first give a log follower time to attach.
With BULK > 0, lines are written BULK at a time (one write, one timestamp each): the trainer is
then no longer what limits the rate, the log path is.
"""

import sys
import time


def main() -> None:
    lines = int(sys.argv[1])
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
    bulk = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if bulk <= 0:
        for n in range(lines):
            t = time.time()
            print(f"seq={n} t={t:.6f} step={n} loss={0.5 + (n % 97) / 1000:.4f} lr=3.0e-04")
        return
    for start in range(0, lines, bulk):
        t = time.time()
        sys.stdout.write(
            "".join(
                f"seq={n} t={t:.6f} step={n} loss={0.5 + (n % 97) / 1000:.4f} lr=3.0e-04\n"
                for n in range(start, min(lines, start + bulk))
            )
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
