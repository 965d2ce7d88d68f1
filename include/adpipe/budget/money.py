"""Money and the charge of one aggregate: pure functions, exact integers.

Amounts are integers of micro-units of the account currency (1.00 =
1_000_000). Prices come in as decimal strings and are converted exactly
(more than six decimal places is an error, never a silent rounding); no
float is ever involved.

The charge of one minute aggregate is::

    impressions x CPM / 1000 + clicks x CPC

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

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

from adpipe import schemas as S
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


# What the budget database's columns hold (adpipe.budget.db uses the same
# numbers): an aggregate that does not fit is quarantined before any
# transaction, never left for the database to reject on every retry. An
# ad_id holds what the stream job admits: the contract's one field limit.
MAX_RECORD_UUID = 64
MAX_AD_ID = S.MAX_FIELD_CHARS
MAX_WINDOW_START = 40
BIGINT_MAX = 2**63 - 1


@dataclass(frozen=True)
class Aggregate:
    """The fields of a minute aggregate the budget needs."""

    record_uuid: str
    ad_id: str
    window_start: str
    impressions: int
    clicks: int

    def counts(self) -> tuple[str, str, int, int]:
        """What must match when a record_uuid is seen again."""
        return (self.ad_id, self.window_start, self.impressions, self.clicks)


class BadAggregate(ValueError):
    """The value is not a minute aggregate of the contract, or does not fit
    the budget database."""


def _count(body: dict, name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadAggregate(f"{name} must be a non-negative integer, got {str(value)[:40]!r}")
    if value > BIGINT_MAX:
        raise BadAggregate(f"{name} {value} is beyond the database's BIGINT ({BIGINT_MAX})")
    return value


def storable_text(value: str) -> str | None:
    """Why PostgreSQL's text would refuse ``value`` (None: it takes it): a NUL
    character, or an unpaired surrogate (not encodable as UTF-8)."""
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate (not valid UTF-8)"
    return None


def _text(body: dict, name: str, limit: int) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise BadAggregate(f"{name} must be a non-empty string")
    if len(value) > limit:
        raise BadAggregate(f"{name} is {len(value)} characters, more than the database's {limit}")
    why = storable_text(value)
    if why:
        raise BadAggregate(f"{name} {why}")
    return value


def parse_aggregate(value: bytes | None) -> Aggregate:
    """Parse and validate one aggregate against the contract and against
    what the budget database can hold; raises :class:`BadAggregate`. The
    one parser of aggregates: the service and ``verify`` both use it."""
    if value is None:
        raise BadAggregate("empty value (tombstone)")
    try:
        body = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadAggregate(f"not JSON: {str(exc)[:200]}") from exc
    if not isinstance(body, dict):
        raise BadAggregate("not a JSON object")
    record_uuid = _text(body, "record_uuid", MAX_RECORD_UUID)
    ad_id = _text(body, "ad_id", MAX_AD_ID)
    window_start = _text(body, "window_start", MAX_WINDOW_START)
    try:
        period_of(window_start, "day")
    except (ValueError, OverflowError) as exc:  # OverflowError: year 1 in a zone east of UTC
        raise BadAggregate(f"window_start {window_start!r} is not an ISO-8601 time with a zone") from exc
    return Aggregate(record_uuid, ad_id, window_start, _count(body, "impressions"), _count(body, "clicks"))


def charge_micros(agg: Aggregate, price: Price) -> int:
    """``spend_micros`` of the aggregate; :class:`BadAggregate` when the
    charge alone is beyond what the database's BIGINT holds."""
    charge = spend_micros(agg.impressions, agg.clicks, price)
    if charge > BIGINT_MAX:
        raise BadAggregate(f"its charge of {charge} micro-units is beyond the database's BIGINT")
    return charge
