"""The rules the page scripts need, from the code that applies them on the server.

Every page with a script gets them as one JSON block (`{{ rules|json_script:"trainyard-rules" }}`
in base.html, filled by the context processor below), and static/trainyard/rules.js reads it.
The scripts hold no copy of their own: change a rule here (or where it is defined) and the pages
follow.
"""

from typing import Any

from django.http import HttpRequest

from jobs import models
from jobs.models import Job
from jobs.money import currency
from jobs.services import totals
from workers import contract

# How seed 004 writes each sum in the formula the New-job page shows.
FORMULA_NAMES = {"cpu": "CPU_total", "gpus": "GPU_total", "memory_gb": "Memory_total"}
FORMULA_UNITS = {"cpu": "", "gpus": "", "memory_gb": " GB"}


def page_rules() -> dict[str, Any]:
    return {
        "tags": {"solo_roles": list(contract.SOLO_ROLES), "format": contract.TAG_FORMAT},
        "states": {
            "terminal": [str(s) for s in Job.TERMINAL_STATES],
            # Waiting for room: no process has started, so there is no log yet.
            "waiting": [str(s) for s in Job.WAITING_STATES],
        },
        # Seed 004: total = Σ package[resource] × instances per role, over the roles the user
        # asks for; the platform's own roles (a parameter-server job's scheduler) are not charged.
        "quota": {
            "resources": [
                {
                    "key": r,
                    "label": totals.RESOURCE_LABELS[r],
                    "formula_name": FORMULA_NAMES[r],
                    "unit": FORMULA_UNITS[r],
                }
                for r in totals.RESOURCES
            ],
            "uncharged_roles": list(models.PLATFORM_ROLES),
        },
        # What prices are in: {"code": "USD", "symbol": "$", "prefix": "$"}.
        "money": currency().as_dict(),
    }


def rules(request: HttpRequest) -> dict[str, Any]:
    """Context processor: `rules` on every page."""
    return {"rules": page_rules()}
