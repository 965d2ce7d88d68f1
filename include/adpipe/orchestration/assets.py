"""Airflow Assets for the published ``ads`` tables (the aggregates'
revisions included): the load's ``publish`` task updates them, so a downstream DAG can be scheduled on them
(``schedule=[TABLE_ASSETS[0]]``) instead of on the clock."""

from __future__ import annotations

from airflow.sdk import Asset

from adpipe.lakehouse import tables as T


def table_asset(table: str) -> Asset:
    """``ads.x`` -> ``Asset(name="ads.x", uri="delta://hive/ads/x")``."""
    database, name = table.split(".", 1)
    return Asset(name=table, uri=f"delta://hive/{database}/{name}", group="adpipe")


TABLE_ASSETS = [table_asset(table) for table in T.PUBLISHED]
