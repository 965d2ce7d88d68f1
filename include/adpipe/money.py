"""Money amounts: exact decimals held as integers of micro-units.

A shared piece: the settings read the budget defaults with it, and the
budget service prices with it (``adpipe.budget.money``). 1.00 is 1_000_000;
more than six decimal places is an error, never a silent rounding, and no
float is ever involved."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MICROS = 1_000_000
_MONEY = re.compile(r"^\d+(\.\d{1,6})?$")

class MoneyError(ValueError):
    """A money amount is not a non-negative decimal with at most 6 places."""


def parse_micros(text: str) -> int:
    """``"2.5"`` -> ``2_500_000``; exact, non-negative, at most 6 decimals."""
    raw = text.strip()
    if not _MONEY.match(raw):
        raise MoneyError(f"{text!r} is not an amount like 2.50 (non-negative, at most 6 decimal places)")
    try:
        value = Decimal(raw) * MICROS
    except InvalidOperation as exc:  # pragma: no cover - the pattern rules it out
        raise MoneyError(f"{text!r} is not a decimal amount") from exc
    assert value == value.to_integral_value()
    return int(value)


def format_micros(micros: int | None) -> str:
    """``2_500_000`` -> ``"2.500000"``; ``None`` -> ``"-"`` (no budget)."""
    if micros is None:
        return "-"
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS)
    return f"{sign}{whole}.{frac:06d}"
