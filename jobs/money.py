"""Money as people read it: amounts with the console's currency (TRAINYARD_CURRENCY).

Amounts stay plain numbers in the models, the API and the reports; only what a page shows
carries the currency. The pages' scripts get the same prefix through the page rules
(jobs/page_rules.py), so a price reads alike whether the server or a script wrote it.
"""

from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

# Symbols nobody misreads. Any other code is written out ("CHF 0.12"): "kr" or "$" alone
# would leave the reader guessing which one.
SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "CNY": "¥", "JPY": "¥", "INR": "₹"}


@dataclass(frozen=True)
class Currency:
    code: str  # ISO 4217: "USD"
    symbol: str  # "$"; the code itself where it has no symbol of its own

    @property
    def prefix(self) -> str:
        """What goes before an amount: "$" (as in $0.12), or "CHF " with a no-break space."""
        return self.symbol if self.symbol != self.code else f"{self.code}\u00a0"

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "symbol": self.symbol, "prefix": self.prefix}


def currency() -> Currency:
    code = settings.TRAINYARD_CURRENCY
    return Currency(code, SYMBOLS.get(code, code))


def format_price(amount: Decimal | float | int) -> str:
    """A price as the catalog sets it: "$0.05", "$1,234.50", "$0.0125" (never rounded away,
    up to four decimals: prices are stored with four), "CHF 3.00"."""
    value = Decimal(str(amount)).quantize(Decimal("0.0001"))
    text = f"{value:,.4f}"
    # Two decimals at least, as money is written; the third and fourth only when they count.
    while text.endswith("0") and len(text.partition(".")[2]) > 2:
        text = text[:-1]
    return f"{currency().prefix}{text}"
