"""The load's Delta writes as SQL (what a Spark Connect session runs as a
local one does; the load tests run them on local sessions): the
statements, and Delta's conflicts told apart by their error class as a
Spark Connect client sees them."""

from __future__ import annotations

import pytest
from adpipe.lakehouse import merge
from adpipe.lakehouse.metastore import create_table_sql
from adpipe.settings import SettingsError, load_settings
from adpipe.spark import connect_address, connect_urls
from pyspark.errors import AnalysisException


def test_the_statements_quote_columns_and_name_partition_and_properties() -> None:
    create = create_table_sql("ads.t", "`a b` STRING NOT NULL, h TIMESTAMP", "h", {"delta.x": "0"})
    assert create == (
        "CREATE TABLE IF NOT EXISTS ads.t (`a b` STRING NOT NULL, h TIMESTAMP) USING delta "
        "PARTITIONED BY (h) TBLPROPERTIES ('delta.x' = '0')"
    )
    assert create_table_sql("ads.r", "a STRING", None, {}) == "CREATE TABLE IF NOT EXISTS ads.r (a STRING) USING delta"
    assert merge.insert_absent(["a", "we`ird"]) == (
        "WHEN NOT MATCHED THEN INSERT (`a`, `we``ird`) VALUES (s.`a`, s.`we``ird`)"
    )
    statement = merge.merge_sql("ads.t", "t.a <=> s.a", "WHEN ...")
    assert statement == "MERGE INTO ads.t t USING {source} s ON t.a <=> s.a WHEN ..."


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] ConcurrentAppendException: Files added", "DELTA_CONCURRENT_APPEND"),
        ("[DELTA_METADATA_CHANGED] MetadataChangedException: The metadata", "DELTA_METADATA_CHANGED"),
        ("io.delta.exceptions.ConcurrentWriteException: Files were added", "ConcurrentWriteException"),
        ("[TABLE_OR_VIEW_NOT_FOUND] The table cannot be found", None),
    ],
)
def test_a_conflict_is_told_by_its_class_in_the_message(text: str, named: str | None) -> None:
    assert merge.conflict_name(RuntimeError(text)) == named
    assert merge.is_write_conflict(RuntimeError(text)) is (named is not None)


def test_a_conflict_is_told_by_the_error_class_a_spark_connect_client_gets() -> None:
    class Remote(AnalysisException):
        def getCondition(self) -> str:  # noqa: N802 - pyspark's name
            return "DELTA_CONCURRENT_DELETE_READ.WITHOUT_HINT"

    assert merge.conflict_name(Remote(message="a file was deleted")) == "DELTA_CONCURRENT_DELETE_READ"


@pytest.mark.parametrize("url", ["http://host:15002", "sc://host", "sc://:15002", "host:15002", "sc://host:port"])
def test_spark_connect_servers_need_sc_host_and_port_and_one_serves_at_its_hosts(url: str) -> None:
    with pytest.raises(SettingsError, match="not a Spark Connect server's sc://host:port"):
        load_settings({"ADPIPE_HOME": "/tmp/x", "ADPIPE_SPARK_CONNECT": url})  # noqa: S108
    two = load_settings({"ADPIPE_HOME": "/tmp/x", "ADPIPE_SPARK_CONNECT": " sc://10.1.2.3:15002, sc://b:1 "})  # noqa: S108
    assert connect_urls(two) == ["sc://10.1.2.3:15002", "sc://b:1"]
    with pytest.raises(RuntimeError, match="none of ADPIPE_SPARK_CONNECT's servers"):
        connect_address(two)  # neither is an address of this host
    assert connect_address(load_settings({"ADPIPE_HOME": "/tmp/x"})) == ("127.0.0.1", 15002)  # noqa: S108
