"""How answers read in a terminal: tables, local times, durations, tagged log lines.

Everything the user asked for goes to stdout; notes and progress go to stderr, so that
`trainyard logs 42 > run.log` and `--json | jq` get only data. Rich leaves colour out when the
output is not a terminal, or when NO_COLOR is set.
"""

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # notes: one line each, never cut
if not out.is_terminal:
    out.width = 200  # a file or a pipe: rows stay whole for grep and cut

STATE_STYLES = {
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "queued": "blue",
    "pending": "blue",
}
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_json_line(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def note(text: str, style: str = "dim") -> None:
    err.print(Text(text, style=style))


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def local_time(value: str | None) -> str:
    """An ISO time from the API in this computer's time zone, e.g. 2026-11-25 09:14:03."""
    moment = parse_time(value)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "—"


def duration(seconds: float | None) -> str:
    """3 h 05 min, 4 min 12 s, 9 s."""
    if seconds is None:
        return "—"
    whole = max(0, int(seconds))  # whole seconds elapsed, as the console's pages count them
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def job_seconds(job: dict[str, Any], now: datetime | None = None) -> float | None:
    """How long the job has run: start to end, or to now while it runs."""
    started = parse_time(job.get("started"))
    if started is None:
        return None
    finished = parse_time(job.get("finished")) or now or datetime.now(started.tzinfo)
    return (finished - started).total_seconds()


def instances(job: dict[str, Any]) -> int:
    return sum(role["instances"] for role in job.get("roles", {}).values())


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    title: str | None = None,
    header: bool = True,
) -> None:
    grid = Table(
        title=Text(title) if title else None,  # a title is text, never markup ([master])
        box=None,
        show_header=header,
        header_style="bold",
        pad_edge=False,
        title_justify="left",
    )
    for k, column in enumerate(columns):
        # Short cells stay whole; the last column (a description, a reason) wraps.
        grid.add_column(column, no_wrap=k < len(columns) - 1, overflow="fold")
    for row in rows:
        grid.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in row))
    out.print(grid)


def tag_of(line_role: str, index: int, tags: dict[tuple[str, int], str]) -> str:
    """The instance's tag as the console shows it ([master], [worker-1], [server-0])."""
    return tags.get((line_role, index)) or f"{line_role}-{index}"


def with_attempt(tag: str, attempt: int) -> str:
    """A restarted job's later attempts say which, counted from 1 as the job page and
    logs.txt show them: `worker-1 · attempt 2`; the first run's lines keep the bare tag."""
    return f"{tag} · attempt {attempt + 1}" if attempt else tag


def tags_of(job: dict[str, Any]) -> dict[tuple[str, int], str]:
    return {(r["role"], r["index"]): r["tag"] for r in job.get("replicas", [])}


def log_line(tag: str, text: str, stream: str) -> None:
    """One line as `[tag] text`; the trainer's text is printed as it is, never as markup."""
    if out.is_terminal:
        line = Text(f"[{tag}] ", style="bold magenta" if stream == "stderr" else "bold cyan")
        line.append(text)
        out.print(line, markup=False, highlight=False, emoji=False)
    else:
        sys.stdout.write(f"[{tag}] {text}\n")
        sys.stdout.flush()


def money(amount: str, currency: str = "") -> str:
    """The API's decimal string as a price: "0.0500" → "0.05", "3.0000" → "3.00", "0.1234"
    stays; with the currency's code before it when known ("USD 0.05")."""
    whole, _, cents = amount.partition(".")
    cents = cents.rstrip("0").ljust(2, "0")
    return f"{currency} {whole}.{cents}".strip()


def human_bytes(size: int) -> str:
    """778 B, 3.4 kB, 12 MB."""
    for unit, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if size >= unit:
            return f"{size / unit:.3g} {suffix}"
    return f"{size} B"


def human_number(value: float | None) -> str:
    """1234567 → 1.23 M; 0.000123 → 0.000123; None → —."""
    if value is None:
        return "—"
    for size, suffix in ((1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.4g}"
