"""The minute aggregate as the budget reads it: the one parser of the
contract's aggregate record (``adpipe.schemas.AGGREGATE_RECORD``) for the
budget service and ``adpipe verify``, with what the budget database's
columns can hold. A value that is not an aggregate, or does not fit, is a
:class:`BadAggregate` (quarantined by the service), never a crash."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from adpipe import schemas as S

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
    # 0 for a window's first emission (and for a record without the field);
    # a later emission of the same window, with its full corrected counts,
    # is one higher.
    revision: int = 0

    def counts(self) -> tuple[str, str, int, int]:
        """What must match when a record_uuid is seen again."""
        return (self.ad_id, self.window_start, self.impressions, self.clicks)


class BadAggregate(ValueError):
    """The value is not a minute aggregate of the contract, or does not fit
    the budget database."""


def _count(body: dict, name: str, default: int | None = None) -> int:
    value = body.get(name)
    if value is None and default is not None:
        return default
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
        _zoned(window_start)
    except (ValueError, OverflowError) as exc:  # OverflowError: year 1 in a zone east of UTC
        raise BadAggregate(f"window_start {window_start!r} is not an ISO-8601 time with a zone") from exc
    return Aggregate(
        record_uuid,
        ad_id,
        window_start,
        _count(body, "impressions"),
        _count(body, "clicks"),
        _count(body, "revision", default=0),
    )


def _zoned(text: str) -> None:
    """ValueError unless ``text`` is an ISO-8601 time with a zone that has a
    UTC time (OverflowError: year 1 in a zone east of UTC), as the budget's
    periods need (``money.period_of``)."""
    ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if ts.tzinfo is None:
        raise ValueError(f"{text!r} has no zone")
    ts.astimezone(UTC)
