"""The data tool both agents of benchmarks/ptc_tokens.py call (a module, so the code agent can
register it by reference)."""

from __future__ import annotations

import csv


def read_csv(path: str) -> list[dict[str, object]]:
    """Read a CSV file; returns every row as a dict of its columns (amounts as numbers)."""
    with open(path, newline="") as f:
        return [{**row, "amount": float(row["amount"])} for row in csv.DictReader(f)]
