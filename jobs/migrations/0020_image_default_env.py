"""Framework images carry default environment variables, and a job keeps the ones it was
submitted with. The CPU starter image sets ACCELERATE_USE_CPU=true, so that HuggingFace
accelerate scripts train as one group on CPU instead of each instance alone."""

from typing import Any

from django.db import migrations, models

CPU_STARTER_IMAGE = "pytorch:2.13-cpu"
CPU_STARTER_DEFAULTS = {"ACCELERATE_USE_CPU": "true"}


def set_the_cpu_starters_defaults(apps: Any, schema_editor: Any) -> None:
    """Only where an admin has set no defaults of their own on it."""
    images = apps.get_model("jobs", "FrameworkImage")
    for image in images.objects.filter(name=CPU_STARTER_IMAGE):
        if not image.default_env:
            image.default_env = CPU_STARTER_DEFAULTS
            image.save(update_fields=["default_env"])


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0019_job_list_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="frameworkimage",
            name="default_env",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="Environment variables every trainer of a job on this image gets: "
                '{"ACCELERATE_USE_CPU": "true"}. A job\'s own variable of the same name wins. '
                "Not secret: every user sees them on the New job form and in the API.",
                verbose_name="default variables",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="image_env",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="The image's default variables when the job was submitted; its own win.",
            ),
        ),
        migrations.RunPython(set_the_cpu_starters_defaults, migrations.RunPython.noop),
    ]
