"""The rules the page scripts need, from the code that applies them on the server.

Every page with a script gets them as one JSON block (`{{ rules|json_script:"trainyard-rules" }}`
in base.html, filled by the context processor below), and static/trainyard/rules.js reads it.
The scripts hold no copy of their own: change a rule here (or where it is defined) and the pages
follow.
"""

from typing import Any

from django.conf import settings
from django.http import HttpRequest

from jobs import consumers, logshape
from jobs.models import Job
from jobs.money import currency
from jobs.services import totals
from workers import contract


def page_rules() -> dict[str, Any]:
    return {
        "tags": {"solo_roles": list(contract.SOLO_ROLES), "format": contract.TAG_FORMAT},
        "states": {
            "terminal": [str(s) for s in Job.TERMINAL_STATES],
            # Waiting for room: no process has started, so there is no log yet.
            "waiting": [str(s) for s in Job.WAITING_STATES],
        },
        # The rows of the New-job page's totals table; the totals themselves, the formula and
        # the advice come from the server's preview (jobs/services/preview.py).
        "quota": {
            "resources": [{"key": r, "label": totals.RESOURCE_LABELS[r]} for r in totals.RESOURCES],
        },
        # What prices are in: {"code": "USD", "symbol": "$", "prefix": "$"}.
        "money": currency().as_dict(),
        # The zone times are shown in; null: the reader's own.
        "time_zone": settings.TRAINYARD_TIME_ZONE or None,
        # How the log viewer compares text: as str.casefold, which lowercases all but these.
        "log": {"casefold": logshape.casefold_exceptions()},
        # The codes the job stream closes with, for the page to say why (jobs/consumers.py).
        "close_codes": {
            "unauthenticated": consumers.CLOSE_UNAUTHENTICATED,
            "not_found": consumers.CLOSE_NOT_FOUND,
            "too_slow": consumers.CLOSE_TOO_SLOW,
        },
    }


def rules(request: HttpRequest) -> dict[str, Any]:
    """Context processor: `rules` on every page."""
    return {"rules": page_rules()}
