"""The run table at 2,000 runs (issue 49): how long a page of the job list takes sorted by a
metric's best value or a config key, with chosen columns, beside the same list in its default
order (newest first) in the same run. Each run has a config and three metric summaries, as
the log keeper leaves them; no run's metric points are read.

    python -m bench.run_table [--runs 2000] [--repeat 15]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

VARIANTS = {
    "newest first (baseline)": "",
    "3 columns, newest first": "columns=config:lr,config:batch-size,metric:eval_accuracy:best",
    "sorted by best eval_accuracy": (
        "columns=config:lr,config:batch-size,metric:eval_accuracy:best"
        "&sort=-metric:eval_accuracy:best"
    ),
    "sorted by config lr": "columns=config:lr&sort=config:lr",
    "one tag, sorted by final loss": "tag=t3&columns=metric:loss:final&sort=metric:loss:final",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=15)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/bench.sqlite3"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        user = _fill(options.runs)
        _measure(user, options.repeat)
    return 0


def _fill(runs: int) -> Any:
    from decimal import Decimal

    from django.contrib.auth.models import User

    from jobs.models import FrameworkImage, Job, JobTag, MetricSummary
    from jobs.runconfig import config_of

    user = User.objects.create_user("bench", is_staff=True)  # force_login: no password
    image = FrameworkImage.objects.create(name="pytorch-bench", framework="pytorch")
    jobs = []
    for i in range(runs):
        args = ["--lr", str(0.001 * (i % 97 + 1)), "--batch-size", str(16 << (i % 4))]
        jobs.append(
            Job(
                owner=user, name=f"run {i}", image=image, program={"example": "digits-ddp"},
                args=args, config=config_of(args, {"SEED": str(i)}), state=Job.State.SUCCEEDED,
                cpu_total=1, gpus_total=0, memory_gb_total=1, price_per_hour=Decimal(0),
                project=f"p{i % 10}",
            )
        )  # fmt: skip
    Job.objects.bulk_create(jobs, batch_size=500)
    ids = list(Job.objects.values_list("pk", flat=True))
    summaries, tags = [], []
    for n, pk in enumerate(ids):
        for name, value in (("eval_accuracy", (n * 37 % 100) / 100), ("loss", 1 + n % 13)):
            summaries.append(
                MetricSummary(
                    job_id=pk, name=name, final=value, minimum=value / 2, maximum=value,
                    final_count=1, final_sum=value, points=100, through_cursor=100,
                )
            )  # fmt: skip
        tags.append(JobTag(job_id=pk, label=f"t{n % 7}"))
    MetricSummary.objects.bulk_create(summaries, batch_size=500)
    JobTag.objects.bulk_create(tags, batch_size=500)
    return user


def _measure(user: Any, repeat: int) -> None:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    baseline = None
    print(f"{'job list page (50 rows)':<34} {'median ms':>9} {'ratio':>6} {'queries':>8}")
    for label, query in VARIANTS.items():
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            answer = client.get(f"/?{query}" if query else "/?sort=-submitted&columns=")
            times.append(time.perf_counter() - started)
            assert answer.status_code == 200, (answer.status_code, answer.content[-3000:])
        with CaptureQueriesContext(connection) as queries:
            client.get(f"/?{query}" if query else "/?sort=-submitted&columns=")
        median = statistics.median(times) * 1000
        baseline = baseline or median
        print(f"{label:<34} {median:>9.1f} {median / baseline:>6.2f} {len(queries):>8}")


if __name__ == "__main__":
    sys.exit(main())
