"""Print as fast as the pipe takes it for SECONDS, 1,000 lines a write, then say how many.

    python firehose.py SECONDS

Lines have the size and shape of a typical training log line (about 60 bytes).
"""

import sys
import time


def main() -> None:
    seconds = float(sys.argv[1])
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        sys.stdout.write(
            "".join(
                f"seq={k} step={k} loss={0.5 + (k % 97) / 1000:.4f} lr=3.0e-04 samples/s=1234\n"
                for k in range(n, n + 1000)
            )
        )
        n += 1000
    sys.stdout.flush()
    print(f"firehose printed {n} lines in {seconds:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
