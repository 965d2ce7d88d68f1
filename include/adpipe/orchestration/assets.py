"""Airflow Assets for the published ``ads`` tables (the aggregates'
revisions included): the load's ``publish`` task updates them, so a downstream DAG can be scheduled on them
(``schedule=[TABLE_ASSETS[0]]``) instead of on the clock."""

from __future__ import annotations

from airflow.sdk import Asset, AssetAlias

from adpipe.lakehouse import tables as T


def table_asset(table: str) -> Asset:
    """``ads.x`` -> ``Asset(name="ads.x", uri="delta://hive/ads/x")``."""
    database, name = table.split(".", 1)
    return Asset(name=table, uri=f"delta://hive/{database}/{name}", group="adpipe")


TABLE_ASSETS = [table_asset(table) for table in T.PUBLISHED]

# The repair of a held hour (``ad_hour_repair``) rewrites the hour in the
# published tables: through this alias its task adds an event to each
# table's Asset, only when it repaired (discarding staged rows changes no
# published table).
REPAIRED_TABLES = AssetAlias(name="adpipe_repaired_tables", group="adpipe")
