"""Prices and budgets (``budget_pricing``): the price file, loading it,
and resolving an ad's price (each of cpm, cpc and budget: the ad's row, else
its campaign's, else the default row)."""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from adpipe.budget.db import SCOPES, insert, pricing
from adpipe.budget.money import Price
from adpipe.budget.writes import key_in
from adpipe.money import parse_micros

PRICE_COLUMNS = ("scope", "key", "campaign_id", "cpm", "cpc", "budget")


@dataclass(frozen=True)
class PriceRow:
    scope: str
    key: str
    campaign_id: str | None = None
    cpm_micros: int | None = None
    cpc_micros: int | None = None
    budget_micros: int | None = None


class PricingError(ValueError):
    """A pricing row or file is invalid."""


def _amount(row: dict[str, str], name: str, line: int) -> int | None:
    raw = (row.get(name) or "").strip()
    if not raw:
        return None
    try:
        return parse_micros(raw)
    except ValueError as exc:
        raise PricingError(f"line {line}: {name}: {exc}") from exc


def read_price_file(path: Path) -> list[PriceRow]:
    """A CSV with header ``scope,key,campaign_id,cpm,cpc,budget``; amounts in
    currency units (``2.50``), empty = inherit."""
    rows = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {"scope", "key"} - set(reader.fieldnames or ())
        if missing:
            raise PricingError(f"{path}: missing columns {sorted(missing)}; expected {','.join(PRICE_COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            scope = (row.get("scope") or "").strip()
            key = (row.get("key") or "").strip()
            if scope not in SCOPES:
                raise PricingError(f"line {line}: scope {scope!r} must be one of {', '.join(SCOPES)}")
            if scope == "default":
                key = "*"
            if not key:
                raise PricingError(f"line {line}: empty key")
            price = PriceRow(
                scope,
                key,
                (row.get("campaign_id") or "").strip() or None if scope == "ad" else None,
                _amount(row, "cpm", line),
                _amount(row, "cpc", line),
                _amount(row, "budget", line),
            )
            if scope == "default" and (price.cpm_micros is None or price.cpc_micros is None):
                raise PricingError(f"line {line}: the default row needs cpm and cpc")
            rows.append(price)
    return rows


def upsert_prices(conn: Connection, rows: Iterable[PriceRow]) -> int:
    """Insert or replace pricing rows (by scope and key)."""
    values = [r.__dict__ for r in rows]
    if not values:
        return 0
    stmt = insert(conn, pricing)
    stmt = stmt.on_conflict_do_update(
        index_elements=["scope", "key"],
        set_={c: stmt.excluded[c] for c in ("campaign_id", "cpm_micros", "cpc_micros", "budget_micros")},
    )
    conn.execute(stmt, values)
    return len(values)


@dataclass(frozen=True)
class PriceBook:
    """Pricing rows as read in one transaction; ``price`` resolves an ad:
    each of cpm, cpc and budget from the ad's row, else its campaign's row,
    else the default row."""

    ads: dict[str, dict]
    campaigns: dict[str, dict]
    default: dict

    def price(self, ad_id: str) -> Price:
        own = self.ads.get(ad_id)
        if own is None:  # most ads: priced by the default row alone
            return self._default_price
        chain = [own, self.campaigns.get(own["campaign_id"]) if own and own["campaign_id"] else None, self.default]
        rows = [r for r in chain if r is not None]

        def first(col: str) -> int | None:
            return next((r[col] for r in rows if r[col] is not None), None)

        return Price(first("cpm_micros"), first("cpc_micros"), first("budget_micros"))  # type: ignore[arg-type]

    @cached_property
    def _default_price(self) -> Price:
        d = self.default
        return Price(d["cpm_micros"], d["cpc_micros"], d["budget_micros"])

    def fingerprint(self) -> str:
        """Changes whenever any row does (pauses are settled against it)."""
        rows = sorted(
            (scope, key, tuple(sorted(r.items())))
            for scope, table in (("ad", self.ads), ("campaign", self.campaigns), ("default", {"*": self.default}))
            for key, r in table.items()
        )
        return hashlib.sha256(repr(rows).encode()).hexdigest()[:32]


def load_price_book(conn: Connection, ad_ids: Iterable[str] | None = None) -> PriceBook:
    """The rows pricing ``ad_ids`` (None: the whole table)."""
    query = sa.select(pricing)
    if ad_ids is not None:
        ads = sorted(set(ad_ids))
        ad_rows = [
            dict(r)
            for r in conn.execute(query.where(pricing.c.scope == "ad", key_in(conn, pricing.c.key, ads))).mappings()
        ]
        campaigns = sorted({r["campaign_id"] for r in ad_rows if r["campaign_id"]})
        other = conn.execute(
            query.where(
                sa.or_(
                    pricing.c.scope == "default",
                    sa.and_(pricing.c.scope == "campaign", key_in(conn, pricing.c.key, campaigns)),
                )
            )
        ).mappings()
        rows = ad_rows + [dict(r) for r in other]
    else:
        rows = [dict(r) for r in conn.execute(query).mappings()]
    by_scope: dict[str, dict[str, dict]] = {scope: {} for scope in SCOPES}
    for r in rows:
        by_scope[r["scope"]][r["key"]] = r
    default = by_scope["default"].get("*")
    if default is None or default["cpm_micros"] is None or default["cpc_micros"] is None:
        raise PricingError("the pricing table has no complete default row (scope 'default', cpm and cpc)")
    return PriceBook(by_scope["ad"], by_scope["campaign"], default)


def resolve_prices(conn: Connection, ad_ids: Iterable[str]) -> dict[str, Price]:
    """The price of each ad (see :class:`PriceBook`)."""
    ads = sorted(set(ad_ids))
    book = load_price_book(conn, ads)
    return {ad: book.price(ad) for ad in ads}
