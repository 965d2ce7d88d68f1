"""Money and the charge of one aggregate: pure functions, exact integers.

Amounts are integers of micro-units of the account currency (1.00 =
1_000_000). Prices come in as decimal strings and are converted exactly
(more than six decimal places is an error, never a silent rounding); no
float is ever involved.

The charge of one minute aggregate is::

    impressions x CPM / 1000 + clicks x CPC

and that of a window's revision the difference between its charge and its
base's (the revision of the window charged before), at the same prices.
``impressions x cpm_micros`` is an exact integer; dividing by 1000 may leave
a fraction of a micro-unit, which is rounded half-to-even, once per
aggregate (the record is the billing line). An ad's spend is the sum of the
charges of its distinct records.

This module is shared by the budget service and by ``adpipe verify``: it is
the *definition* of the price, not the service's way of applying batches.
Verify's independence lies in what it reads (a plain read_committed read of
the aggregates topic, its own dedupe by record_uuid, its own price lookup
and sums); the unit tests pin this function to hand-computed values, and
the integration tests recompute charges with their own Decimal arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

from adpipe.budget.aggregate import BIGINT_MAX, Aggregate, BadAggregate
from adpipe.settings import BUDGET_PERIODS as PERIODS


def _div_round_half_even(numerator: int, denominator: int) -> int:
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


@dataclass(frozen=True)
class Price:
    """What one ad pays: per thousand impressions, per click; its budget per
    budget period (``None``: no budget, never paused)."""

    cpm_micros: int
    cpc_micros: int
    budget_micros: int | None = None


def spend_micros(impressions: int, clicks: int, price: Price) -> int:
    """The charge of one aggregate in micro-units (see the module doc)."""
    if impressions < 0 or clicks < 0:
        raise ValueError(f"negative counts: impressions={impressions} clicks={clicks}")
    return _div_round_half_even(impressions * price.cpm_micros, 1000) + clicks * price.cpc_micros


# Cached: every aggregate of a batch asks it, for a few dozen distinct windows.
@lru_cache(maxsize=65536)
def period_of(window_start: str, period: str) -> str:
    """The budget period an aggregate counts in, from its event-time window
    (never the wall clock): ``day`` 2026-11-22, ``hour`` 2026-11-22T12,
    ``month`` 2026-11, ``total`` total."""
    if period == "total":
        return "total"
    ts = datetime.fromisoformat(window_start.replace("Z", "+00:00"))
    if ts.tzinfo is None:
        raise ValueError(f"window_start {window_start!r} has no zone")
    ts = ts.astimezone(UTC)
    if period == "day":
        return ts.strftime("%Y-%m-%d")
    if period == "hour":
        return ts.strftime("%Y-%m-%dT%H")
    if period == "month":
        return ts.strftime("%Y-%m")
    raise ValueError(f"unknown budget period {period!r}; expected one of {', '.join(PERIODS)}")


def charge_micros(agg: Aggregate, price: Price, base_impressions: int = 0, base_clicks: int = 0) -> int:
    """The charge of the aggregate, a revision of a window charged before at
    ``base_impressions`` / ``base_clicks``: ``spend_micros`` of its counts
    less ``spend_micros`` of the base's, both at ``price`` (a window's
    charges then add up to the price of its latest revision).
    :class:`BadAggregate` when the charge is beyond what the database's
    BIGINT holds; ValueError when a count is below the base's (revisions
    only add events: the caller quarantines such a record)."""
    if agg.impressions < base_impressions or agg.clicks < base_clicks:
        raise ValueError(
            f"counts ({agg.impressions}, {agg.clicks}) below the base's ({base_impressions}, {base_clicks})"
        )
    charge = spend_micros(agg.impressions, agg.clicks, price) - spend_micros(base_impressions, base_clicks, price)
    if charge > BIGINT_MAX:
        raise BadAggregate(f"its charge of {charge} micro-units is beyond the database's BIGINT")
    return charge
