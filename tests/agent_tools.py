"""Tools the agent tests register (module level, so a resumed task can import them again)."""

from __future__ import annotations

import ringzero

REGIONS = ("north", "south", "east", "west")
TOOL_CALLS: list[str] = []


@ringzero.code_may_set("rows")  # the model's code may ask for fewer rows
def load_sales(rows: int = 1000) -> list[dict[str, object]]:
    """Load the sales table: one row per sale with its region and amount in dollars."""
    TOOL_CALLS.append("load_sales")
    return [{"region": REGIONS[i % 4], "amount": (i * 37) % 101} for i in range(rows)]


def get_weather(city: str) -> str:
    """Get the current weather forecast for a city."""
    TOOL_CALLS.append("get_weather")
    return {"paris": "sunny", "oslo": "snow"}.get(city.lower(), "unknown")


def convert_currency(amount: float, rate: float) -> float:
    """Convert an amount of money with an exchange rate."""
    return round(amount * rate, 2)


def send_email(to: str, subject: str) -> str:
    """Send an email message to a recipient."""
    return f"sent to {to}"


def resize_image(path: str, width: int) -> str:
    """Resize an image file to a width in pixels."""
    return path


def translate_text(text: str, language: str) -> str:
    """Translate text into another language."""
    return text


def stock_history(ticker: str) -> list[float]:
    """Daily closing prices of a stock ticker over the last year."""
    return [100.0 + (i % 7) for i in range(250)]


def geocode(address: str) -> tuple[float, float]:
    """Latitude and longitude of a street address."""
    return (48.85, 2.35)


def expected_totals(rows: int = 1000) -> dict[str, int]:
    """The per-region totals of load_sales(rows), computed directly (for the assertions)."""
    totals = dict.fromkeys(REGIONS, 0)
    for i in range(rows):
        totals[REGIONS[i % 4]] += (i * 37) % 101
    return totals
