"""What a failed job's page leads with: what failed, where, how it ended (the exit code, or
the signal by name), the last error lines, read from what the services recorded (the job's
reason names the root cause: outcomes.root_cause). Nothing here is worked out a second way.
"""

from dataclasses import dataclass

from jobs.models import Job
from jobs.services.lifecycle import outcomes
from workers.supervisor import describe_exit

# outcomes.with_stderr puts the failed process's last stderr lines under this line.
STDERR_HEADING = "last lines of stderr:"
EARLIER_ATTEMPTS = ("gave up after ", "no restart: ")


@dataclass(frozen=True)
class FailureSummary:
    headline: str  # the reason's first line: what failed and why
    instance: str  # [worker-1]; "" when no instance failed (a health rule, a lost node...)
    node: str
    how: str  # "exited with code 3", "killed by signal SIGTERM"; "" when not known
    error_lines: str  # the failed process's last stderr lines, one a line
    more: str  # the reason's other lines (earlier attempts), shown below


def summary(job: Job) -> FailureSummary | None:
    """The banner of a failed job; None for any other state."""
    if job.state != Job.State.FAILED:
        return None
    lines = job.reason.splitlines()
    error_lines: list[str] = []
    if STDERR_HEADING in lines:
        cut = lines.index(STDERR_HEADING)
        # restarts.final_reason follows the stderr lines with the earlier attempts.
        end = next(
            (i for i in range(cut + 1, len(lines)) if lines[i].startswith(EARLIER_ATTEMPTS)),
            len(lines),
        )
        error_lines = lines[cut + 1 : end]
        lines = lines[:cut] + lines[end:]
    first = outcomes.first_failure(job)
    return FailureSummary(
        headline=lines[0] if lines else "The job failed.",
        instance=first.tag if first else "",
        node=first.node.name if first and first.node else "",
        how=describe_exit(first.exit_code) if first and first.exit_code is not None else "",
        error_lines="\n".join(error_lines),
        more="\n".join(lines[1:]),
    )
