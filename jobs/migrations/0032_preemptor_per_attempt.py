"""The preemptor of each attempt on the attempt, in place of the job's last preemption time:
a job preempted once was credited to that preemptor whenever a later attempt stopped."""

import re

from django.db import migrations, models

PREEMPTED = re.compile(r"preempted by job (\d+) ")


def preemptors_from_reasons(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Attempts that ended preempted say by which job in their reason (scheduler.evictions)."""
    JobAttempt = apps.get_model("jobs", "JobAttempt")
    for attempt in JobAttempt.objects.filter(reason__startswith="preempted by job ").only(
        "id", "reason"
    ):
        found = PREEMPTED.match(attempt.reason)
        if found:
            JobAttempt.objects.filter(pk=attempt.pk).update(preempted_by=int(found.group(1)))


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0031_instance_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobattempt",
            name="preempted_by",
            field=models.PositiveBigIntegerField(
                blank=True, help_text="The job whose preemption ended this attempt.", null=True
            ),
        ),
        migrations.RunPython(preemptors_from_reasons, migrations.RunPython.noop),
        migrations.RemoveField(model_name="job", name="last_preempted"),
    ]
