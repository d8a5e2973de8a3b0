"""Print log lines at a steady RATE per second for SECONDS, each with its print time.

    python -u paced.py RATE SECONDS [DELAY]

Every line is `seq=<n> t=<time.time()> ...`, time.time() read just before that line's print,
so a reader's receive time minus t is the line's latency from print to reader. DELAY seconds
of sleep first give a log follower time to attach.
"""

import sys
import time


def main() -> None:
    rate = float(sys.argv[1])
    total = int(rate * float(sys.argv[2]))
    time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
    start = time.time()
    n = 0
    while n < total:
        # Catch up on every line that is due by now, then sleep until the next one is: a
        # sleep per line would be coarser than the 100 us between lines at 10,000 lines/s.
        due = min(total, int((time.time() - start) * rate) + 1)
        while n < due:
            print(f"seq={n} t={time.time():.6f} step={n} loss={0.5 + (n % 97) / 1000:.4f}")
            n += 1
        wait = start + n / rate - time.time()
        if wait > 0:
            time.sleep(wait)


if __name__ == "__main__":
    main()
