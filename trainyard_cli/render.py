"""How answers read in a terminal: tables, local times, durations, prices, counts, tagged log
lines. The CLI's one formatter: every time, duration, price and count it prints is written here,
the same way the pages write it (static/trainyard/format.js, jobs/money.py), with the console's
currency from its catalog.

Everything the user asked for goes to stdout; notes and progress go to stderr, so that
`trainyard logs 42 > run.log` and `--json | jq` get only data. Rich leaves colour out when the
output is not a terminal, or when NO_COLOR is set.
"""

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime, tzinfo
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainyard_cli.states import States

out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # notes: one line each, never cut
if not out.is_terminal:
    out.width = 200  # a file or a pipe: rows stay whole for grep and cut


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_json_line(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def note(text: str, style: str = "dim") -> None:
    err.print(Text(text, style=style))


def state_text(state: str, states: States) -> Text:
    """A job's or instance's state, coloured by what the console says it means."""
    return Text(state, style=states.style(state))


def exit_text(replica: dict[str, Any]) -> str:
    """How an instance's process ended, as the page says it: the signal by name (SIGTERM,
    never -15), else the exit code; "" while it runs."""
    if replica.get("signal"):
        return str(replica["signal"])
    code = replica.get("exit_code")
    return "" if code is None else str(code)


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


# The zone times are written in: the console's (its catalog's time_zone), else None for this
# computer's own, as the pages use the reader's.
_shown_zone: tzinfo | None = None


def show_times_in(name: str | None) -> None:
    """Write times from now on in the zone the console names (TRAINYARD_TIME_ZONE); None, or a
    zone this computer does not know, keeps this computer's own."""
    global _shown_zone
    try:
        _shown_zone = ZoneInfo(name) if name else None
    except (ZoneInfoNotFoundError, ValueError):
        _shown_zone = None


def local_time(value: str | None) -> str:
    """An ISO time from the API in the shown zone, e.g. 2026-11-25 09:14:03."""
    moment = parse_time(value)
    return moment.astimezone(_shown_zone).strftime("%Y-%m-%d %H:%M:%S") if moment else "—"


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


def instances(job: dict[str, Any]) -> str:
    """ "3", "5 (4 trainers + scheduler)": the console's own count, as the job list says it
    (a scheduler is an instance too); a console too old to say gets the roles' sum."""
    counted = job.get("instances")
    if isinstance(counted, dict) and "text" in counted:
        return str(counted["text"])
    return str(sum(_most(role["instances"]) for role in job.get("roles", {}).values()))


def count_of(instances: int | dict[str, int]) -> str:
    """ "3", or an elastic role's "1-3"."""
    if isinstance(instances, dict):
        return f"{instances['min']}-{instances['max']}"
    return str(instances)


def _most(instances: int | dict[str, int]) -> int:
    return instances["max"] if isinstance(instances, dict) else instances


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


def log_line(tag: str, text: str, stream: str, shown: list[list[str]] | None = None) -> None:
    """One line as `[tag] text`, never as markup. On a terminal, the text as the console shaped
    it (`shown`: no escape sequence of the trainer's reaches the terminal, and a line a progress
    bar overwrote shows its last state, as on the page); into a file or a pipe, as printed."""
    if out.is_terminal:
        line = Text(f"[{tag}] ", style="bold magenta" if stream == "stderr" else "bold cyan")
        line.append("".join(part[0] for part in shown) if shown is not None else text)
        out.print(line, markup=False, highlight=False, emoji=False)
    else:
        sys.stdout.write(f"[{tag}] {text}\n")
        sys.stdout.flush()


def money(amount: str | float | None, prefix: str = "") -> str:
    """The API's decimal string as the pages write a price (jobs/money.py): "0.0500" with
    prefix "$" → "$0.05", "3.0000" → "$3.00", "1234.5" → "$1,234.50", "0.0125" stays
    (prices are stored with four decimals; the third and fourth show only when they count).
    `prefix` is the console's, from its catalog (currency_prefix); "—" for no amount."""
    if amount is None:
        return "—"
    value = Decimal(str(amount)).quantize(Decimal("0.0001"))
    text = f"{value:,.4f}"
    while text.endswith("0") and len(text.partition(".")[2]) > 2:
        text = text[:-1]
    return f"{prefix}{text}"


def currency_prefix(catalog: dict[str, Any]) -> str:
    """What goes before an amount, as the console's settings say: "$", "€", or "CHF" and a
    no-break space; a console too old to say writes its currency's code before it."""
    written = catalog.get("money")
    if isinstance(written, dict) and "prefix" in written:
        return str(written["prefix"])
    code = catalog.get("currency") or ""
    return f"{code}\u00a0" if code else ""


def ago(value: str | None, now: datetime | None = None) -> str:
    """An ISO time from the API as how long ago it was, as the pages say it: "5 s ago",
    "3 min 05 s ago"; "never" for none."""
    moment = parse_time(value)
    if moment is None:
        return "never"
    return f"{duration(((now or datetime.now(moment.tzinfo)) - moment).total_seconds())} ago"


def human_bytes(size: int) -> str:
    """778 B, 3.4 kB, 12 MB."""
    for unit, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if size >= unit:
            return f"{size / unit:.3g} {suffix}"
    return f"{size} B"


def ratio(value: float | None) -> str:
    """A speedup or an efficiency as the compare page writes it: 1.85; None → —."""
    return "—" if value is None else f"{value:.2f}"


def human_number(value: float | None) -> str:
    """1234567 → 1.23 M; 0.000123 → 0.000123; None → —."""
    if value is None:
        return "—"
    for size, suffix in ((1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.4g}"
