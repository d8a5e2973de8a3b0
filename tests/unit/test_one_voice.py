"""One voice: the pages, the API and the CLI write times, durations, prices and counts alike,
each side through its one formatter, and say the settings' values as the server has them.

The formatters themselves are tested beside them (test_money_and_times.py, test_cli.py); here,
that nothing goes around them, and that the counts and settings read the same everywhere."""

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from jobs.models import ApiToken, Node
from jobs.services.submission import check_job_request, submit_job
from jobs.services.views.counts import instance_count
from tests.unit.helpers import job_request
from tests.unit.test_parameter_server_jobs import ps_request
from trainyard_cli import render

ROOT = Path(__file__).resolve().parents[2]

# What formats a time, a duration or a price by its own code, per kind of file, with why it is
# refused. The one formatter of each side is exempt: static/trainyard/format.js (with its pure
# half clock.js, and times.js, which applies it to the server's <time> elements),
# jobs/templatetags/trainyard.py for the templates, trainyard_cli/render.py for the CLI.
TEMPLATE_PATTERNS = {
    r"\|\s*date\b": "Django's |date: use {% local_time %} or |utc_time",
    r"\|\s*time\b": "Django's |time: use {% local_time %}",
    r"\btimesince\b|\btimeuntil\b": 'timesince says "0 minutes" for 5 s: use |ago',
    r"\bnaturaltime\b|\bnaturalday\b": "humanize's own wording: use |ago or {% local_time %}",
    r"\{%\s*now\b": "{% now %}: use {% local_time %}",
    r"\$\s*\{\{|USD|\bfloatformat\b": "a price written by hand: use |money",
}
SCRIPT_PATTERNS = {
    r"\btoLocale\w*String\b|Intl\.DateTimeFormat": "the browser's own time format: use format.js",
    r"\.toISOString\(\)|\.toUTCString\(\)|\.to(?:Date|Time)String\(\)": "use formatLocalTime",
    r"\.get(?:UTC)?(?:FullYear|Month|Date|Hours|Minutes|Seconds)\(": "use formatLocalTime",
    r"\bpadStart\b": "digits padded by hand: a time or duration formatter belongs in format.js",
    r"/\s*(?:60|3600)\b": "seconds cut into minutes by hand: use formatDuration",
    r"[\"'`]\$[\"'`]|\bUSD\b|currency:": "a currency written by hand: use formatMoney/formatPrice",
}
CLI_PATTERNS = {
    r"\bstrftime\b|\.astimezone\(": "a time written by hand: use render.local_time",
    r"\bdivmod\(|//\s*(?:60|3600)\b": "seconds cut into minutes by hand: use render.duration",
    r":[,]?\.\d+f\}": "a number rounded by hand: use render.duration, render.money",
    r"[\"']\$|\bUSD\b|[\"']currency[\"']": "a currency written by hand: use render.money",
}
SCRIPT_FORMATTERS = {"format.js", "clock.js", "times.js"}
# job/charts.js and compare.js still keep Intl.NumberFormats of their own for counts and
# percentages (the same output as formatCount) and two-decimal figures (a speedup); it is
# refused everywhere else.
OWN_NUMBER_FORMAT_ALLOWED = {"charts.js", "compare.js"}


def offences(files: list[Path], patterns: dict[str, str]) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith(("//", "#", "{#", "*", '"""')):
                continue  # what a comment says is not what the page shows
            for pattern, why in patterns.items():
                if re.search(pattern, line):
                    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                    found.append(f"{where}:{number}: {why}: {line.strip()}")
    return found


def test_no_template_formats_a_time_duration_or_price_by_itself() -> None:
    templates = sorted((ROOT / "templates").rglob("*.html"))
    assert templates
    assert offences(templates, TEMPLATE_PATTERNS) == []


def test_no_page_script_formats_a_time_duration_or_price_by_itself() -> None:
    scripts = sorted((ROOT / "static" / "trainyard").rglob("*.js"))
    assert {p.name for p in scripts} >= SCRIPT_FORMATTERS | {"state.js", "logview.js"}
    ours = [p for p in scripts if p.name not in SCRIPT_FORMATTERS]
    assert offences(ours, SCRIPT_PATTERNS) == []
    counting = [p for p in ours if p.name not in OWN_NUMBER_FORMAT_ALLOWED]
    assert offences(counting, {r"Intl\.NumberFormat": "a count formatter: use formatCount"}) == []


def test_the_cli_formats_times_durations_and_prices_only_in_render() -> None:
    modules = sorted((ROOT / "trainyard_cli").glob("*.py"))
    assert (ROOT / "trainyard_cli" / "render.py") in modules
    ours = [p for p in modules if p.name != "render.py"]
    assert offences(ours, CLI_PATTERNS) == []


def test_the_scan_would_catch_what_it_looks_for(tmp_path: Path) -> None:
    """The patterns are live: each kind of file's usual slips are found."""
    page = tmp_path / "page.html"
    page.write_text('{{ t|date:"Y-m-d" }}\n{{ n.last_heartbeat|timesince }} ago\n${{ price }}\n')
    script = tmp_path / "page.js"
    script.write_text("el.textContent = new Date(iso).toLocaleTimeString();\nconst s = `$`;\n")
    cli = tmp_path / "cli.py"
    cli.write_text(
        'text = f"USD {amount:.2f}"\nwhen = moment.strftime("%H:%M")\ncode = c["currency"]\n'
    )
    for path, patterns, lines in ((page, TEMPLATE_PATTERNS, 3), (script, SCRIPT_PATTERNS, 2),
                                  (cli, CLI_PATTERNS, 3)):  # fmt: skip
        found = offences([path], patterns)
        assert len({text.split(":")[1] for text in found}) == lines, found


@pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")
def test_a_parameter_server_job_counts_its_scheduler_alike_on_the_list_the_api_and_the_cli(
    client: Client, alice: User
) -> None:
    """The web list said 5 and `trainyard ls` 4: both now say what is true, 4 trainers the
    user asked for (and is charged for) and the scheduler the platform adds."""
    ps = submit_job(alice, check_job_request(ps_request(servers=2, workers=2)))
    torch = submit_job(alice, check_job_request(job_request(instances=3)))
    assert instance_count(ps).total == ps.replicas.count() == 5
    assert instance_count(torch).total == torch.replicas.count() == 3

    token = ApiToken.issue(alice)
    answers = {
        j["id"]: j
        for j in client.get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Token {token}").json()["jobs"]
    }
    assert answers[ps.pk]["instances"] == {
        "total": 5,
        "trainers": 4,
        "platform": ["scheduler"],
        "text": "5 (4 trainers + scheduler)",
    }
    assert answers[torch.pk]["instances"]["text"] == "3"

    client.force_login(alice)
    page = client.get("/").content.decode()
    for job in (ps, torch):
        cell = re.search(
            rf'<tr data-job="{job.pk}">.*?<td class="instances">([^<]*)</td>', page, re.S
        )
        assert cell is not None
        assert cell.group(1) == render.instances(answers[job.pk])  # what `trainyard ls` prints


@pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")
def test_the_nodes_page_says_the_settings_values_and_how_long_ago_in_seconds(
    client: Client, alice: User, settings: Any
) -> None:
    settings.TRAINYARD_NODE_STALE_SECONDS = 17
    settings.TRAINYARD_NODE_LOST_SECONDS = 53
    Node.objects.update(last_heartbeat=timezone.now() - timedelta(seconds=5, milliseconds=300))
    client.force_login(alice)
    html = client.get("/nodes/").content.decode()
    timing = re.search(r'<p class="muted" id="node-timing">(.*?)</p>', html, re.S)
    assert timing is not None
    text = re.sub(r"<[^>]+>", "", timing.group(1))
    assert "heartbeat for 17 s" in text and "silent 53 s" in text
    assert "15 s" not in text and "45 s" not in text
    beats = re.findall(r'<td class="heartbeat" title="[^"]+ UTC">([^<]*)</td>', html)
    assert beats and set(beats) == {"5 s ago"}
    names = re.findall(r'<td class="node-name">([^<]*)</td>', html)
    assert names == sorted(Node.objects.values_list("name", flat=True))


def test_node_names_do_not_wrap() -> None:
    css = (ROOT / "static" / "trainyard" / "trainyard.css").read_text()
    assert re.search(r"\.node-name\s*\{[^}]*white-space:\s*nowrap", css)
    # The job page's Instances table and its per-node line counts mark their names so.
    assert 'className = "node-name"' in (ROOT / "static/trainyard/job/state.js").read_text()
    assert 'className = "node-name"' in (ROOT / "static/trainyard/job/log/counts.js").read_text()


@pytest.mark.usefixtures("catalog")
def test_the_catalog_tells_clients_how_prices_are_written(
    client: Client, alice: User, settings: Any
) -> None:
    settings.TRAINYARD_CURRENCY = "EUR"
    token = ApiToken.issue(alice)
    catalog = client.get("/api/v1/catalog", HTTP_AUTHORIZATION=f"Token {token}").json()
    assert catalog["money"] == {"code": "EUR", "symbol": "€", "prefix": "€"}
    price = next(p["price_per_hour"] for p in catalog["packages"])
    assert render.money(price, render.currency_prefix(catalog)).startswith("€")
