"""The exception a trainer's last Python traceback ended with, read from its stderr lines: what
a failure's reason names when the trainer did not record one (torch's @record).

Read as Python prints a traceback: a "Traceback (most recent call last):" line, frames indented
under it, then the exception at the margin, its message running on over indented lines. The
tail the agent keeps may begin mid-traceback (a deep stack through DDP is longer than the
tail), so frame lines alone also mark one. torch.distributed (2.4 and later) prefixes every
line an initialised rank's uncaught exception prints with "[rank1]: " (launchers that tee
output, "[default1]:"); the lines are read without it.
"""

import re

TRACEBACK_START = "Traceback (most recent call last):"
FRAME = re.compile(r'^\s+File "[^"]*", line \d+')
# "ValueError: boom", "torch.distributed.DistBackendError: ...", "KeyboardInterrupt", a
# class of any name: the line at the margin after the frames.
EXCEPTION_HEAD = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::(?:\s.*)?)?$")
RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
MAX_EXCEPTION_CHARS = 500
# argparse's parser.error(): "usage: train.py [-h] …", then "train.py: error: …", exit code 2.
USAGE_START = "usage:"
USAGE_ERROR = re.compile(r"^\S+: error: \S.*$")
# How near the end of stderr an error must be for the process to have ended with it.
ENDED_WITH_LINES = 5


def last_exception(lines: list[str]) -> str | None:
    """The first line of the exception the last traceback in `lines` ended with
    ("ValueError: boom"), or None when they hold no traceback."""
    found = None
    in_traceback = False
    for raw in lines:
        line = RANK_PREFIX.sub("", raw).rstrip()
        if line.startswith(TRACEBACK_START) or FRAME.match(line):
            in_traceback = True
        elif not line.strip():
            in_traceback = False  # Python prints no blank line inside a traceback
        elif in_traceback and not line[0].isspace():
            in_traceback = False
            if EXCEPTION_HEAD.match(line):
                found = line[:MAX_EXCEPTION_CHARS]
    return found


# What libstdc++ prints when a C++ thread object is destroyed while its thread still runs. A
# torch script whose process group is still alive when the interpreter exits can end so
# (gloo's threads outlive it): it trained, then died of SIGABRT. destroy_process_group() alone
# is not enough while a DDP model, in reference cycles, still holds the group: a script that
# called it aborted in 8 runs of 60 with 3 ranks (torch 2.13, gloo); with the model released
# and collected first, in none of 60. Said plainly, with the fix.
UNJOINED_THREAD = "terminate called without an active exception"
UNJOINED_THREAD_HINT = (
    'aborted while exiting: a C++ thread was still running ("terminate called without an '
    'active exception"); a torch script whose process group is still alive at exit can end '
    "so: at the end of the script, drop the DDP model (del), call gc.collect(), then "
    "torch.distributed.destroy_process_group()"
)


def known_abort(lines: list[str]) -> str | None:
    """A plain reason for a native abort whose cause is known, from stderr's last lines."""
    if any(UNJOINED_THREAD in RANK_PREFIX.sub("", line) for line in lines):
        return UNJOINED_THREAD_HINT
    return None


def usage_error(lines: list[str]) -> str | None:
    """argparse's error line ("train.py: error: unrecognized arguments: --steps 5") when
    `lines` end with a usage message, else None."""
    shown = _written(lines)
    if shown and USAGE_ERROR.match(shown[-1]) and any(s.startswith(USAGE_START) for s in shown):
        return shown[-1][:MAX_EXCEPTION_CHARS]
    return None


def own_error(lines: list[str]) -> str | None:
    """What a trainer's stderr says it failed of: its last exception, argparse's error, or a
    known native abort; None when it says nothing of the kind."""
    return last_exception(lines) or usage_error(lines) or known_abort(lines)


def ended_with_error(lines: list[str]) -> str | None:
    """own_error, only when stderr ends with it (an exception caught, printed and survived
    long before is not how the process ended)."""
    error = own_error(lines)
    if error is None:
        return None
    last = _written(lines)[-ENDED_WITH_LINES:]
    return error if any(error in line for line in last) else None


def _written(lines: list[str]) -> list[str]:
    """The lines that are not blank, as the trainer wrote them (without torch's rank prefix)."""
    return [RANK_PREFIX.sub("", line).rstrip() for line in lines if line.strip()]
