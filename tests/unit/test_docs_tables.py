"""docs/tables.md holds to the code: each table's columns (name, type,
nullable, in order) and unique key are the schemas' of
``adpipe.lakehouse.tables``, every schema there is on the page, every
quarantine source is named, each view has the columns the page gives, and
every query on the page runs: the Spark SQL ones on empty tables of the
code's schemas, the one without Spark on rows Spark wrote."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from adpipe.lakehouse import rows as lake_rows
from adpipe.lakehouse import tables as T
from adpipe.settings import PROJECT_ROOT
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from tests.unit.helpers import DOCS, checked_blocks, doc_sections, first_code, table_rows

TABLES_MD = DOCS / "tables.md"
HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)


def documented_tables() -> dict[str, str]:
    """The page's table sections (``### `ads.x` ``), by table name."""
    sections = doc_sections(TABLES_MD, level=3)
    return {first_code(h): text for h, text in sections.items() if h.startswith("`ads.")}


def documented_columns(section: str) -> list[tuple[str, str, bool]]:
    """The first column table of a section: (name, type, nullable)."""
    columns = []
    for row in table_rows(section.split("\n\n|", 1)[0] if section.startswith("|") else section):
        if len(row) == 4 and row[2] in ("yes", "no"):
            columns.append((first_code(row[0]), row[1], row[2] == "yes"))
        elif columns:
            break
    return columns


def schema_columns(schema: StructType) -> list[tuple[str, str, bool]]:
    return [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields]


def code_tables() -> dict[str, StructType]:
    """Every published table (the aggregates' revisions too) and the ledger."""
    return {**T.PUBLISHED, T.LOAD_RUNS: T.LOAD_RUNS_SCHEMA}


def test_each_tables_columns_are_its_schemas() -> None:
    documented = documented_tables()
    assert sorted(documented) == sorted(code_tables()), "tables.md's tables are not the code's"
    for name, schema in code_tables().items():
        assert documented_columns(documented[name]) == schema_columns(schema), f"{name}: columns differ"


def test_every_schema_of_the_tables_module_is_documented() -> None:
    """A schema added to adpipe.lakehouse.tables (a new table) fails here
    until the page has a table with its columns."""
    documented = [documented_columns(text) for text in documented_tables().values()]
    schemas = {k: v for k, v in vars(T).items() if isinstance(v, StructType)}
    assert len(schemas) >= 4
    for name, schema in schemas.items():
        assert schema_columns(schema) in documented, f"tables.{name} has no table in docs/tables.md"


def test_the_shared_columns_are_the_tables_last_ones() -> None:
    """Last in every published table, but for the aggregates' ``revision``
    after them (the column a table of a version before revisions gained)."""
    shared = documented_columns(doc_sections(TABLES_MD)["The tables"].split("### ", 1)[0])
    assert len(shared) == 6
    for name, schema in T.PUBLISHED.items():
        columns = schema_columns(schema)
        if name in (T.AGGREGATES, T.REVISIONS):
            assert columns[-1][0] == "revision", name
            columns = columns[:-1]
        assert columns[-6:] == shared, name


def published_keys() -> dict[str, tuple[str, ...]]:
    """Each published table's unique key: the key of the rows a load reads
    (``T.TABLES``) in the table that holds every one of them, and the
    window's for ``ads.ad_minute_aggregates`` (each window's latest)."""
    keys = {T.loaded_in(name): keys for name, (_schema, keys) in T.TABLES.items()}
    return keys | {T.AGGREGATES: T.WINDOW_KEY}


def test_each_tables_unique_key_is_the_merges() -> None:
    documented = documented_tables()
    assert sorted(published_keys()) == sorted(T.PUBLISHED)
    for name, keys in published_keys().items():
        found = re.search(r"Unique key:\s+\(([^)]*)\)", documented[name])
        assert found, f"{name}: no 'Unique key: (...)' line"
        assert tuple(re.findall(r"`([^`]+)`", found.group(1))) == keys, name


def test_every_quarantine_source_is_named() -> None:
    section = documented_tables()[T.QUARANTINE]
    sources = {v for module in (T, lake_rows) for k, v in vars(module).items() if k.startswith("SOURCE_")}
    assert len(sources) == 5
    for source in sources:
        assert f"| `{source}` |" in section, f"quarantine source {source} is not in docs/tables.md"


def test_the_ledgers_steps_are_the_pages() -> None:
    """The page's table of the ledger's steps names exactly T.LEDGER_STEPS,
    and every step the code writes is one of them."""
    section = documented_tables()[T.LOAD_RUNS]
    steps = [first_code(row[0]) for row in table_rows(section) if len(row) == 3]
    assert steps == list(T.LEDGER_STEPS)
    code = "\n".join(p.read_text() for p in (PROJECT_ROOT / "include" / "adpipe" / "lakehouse").glob("*.py"))
    written = set(re.findall(r'_append_ledger\(\s*spark,\s*[^,]+,\s*"(\w+)"', code))
    written |= set(re.findall(r'\bstep="(\w+)"', code))
    assert written and written <= set(T.LEDGER_STEPS), written - set(T.LEDGER_STEPS)


# --- the queries run --------------------------------------------------------------

DATABASE = "docs_ads"


def in_test_database(sql: str) -> str:
    """The page's SQL on this test's database instead of ``ads``."""
    return re.sub(r"\bads\.", f"{DATABASE}.", sql)


@pytest.fixture(scope="module")
def tables(spark: SparkSession):  # noqa: ANN201 - yields the warehouse path
    """The code's tables (empty, but for a few aggregate and ledger rows)
    and views, in a database of this test's, dropped after it."""
    spark.sql(f"DROP DATABASE IF EXISTS {DATABASE} CASCADE")
    spark.sql(f"CREATE DATABASE {DATABASE}")
    for name, schema in code_tables().items():
        writer = spark.createDataFrame([], schema).write.format("delta")
        writer = writer.partitionBy("event_hour") if "event_hour" in schema.fieldNames() else writer
        writer.saveAsTable(in_test_database(name))
    # Run 1 published revision 0 of a window, run 2 (still unfinished)
    # replaced it with revision 1: a whole-hour reader sees revision 0 alone.
    loaded = datetime(2026, 11, 22, 13, 5, tzinfo=UTC)
    revisions = [
        (f"u{run}", "ad-000042", HOUR.replace(minute=34), HOUR.replace(minute=35), 100 * run, run, HOUR,
         "region-local", "ad-aggregates", 0, run, loaded, run, run - 1)
        for run in (1, 2)
    ]
    for table, rows in ((T.REVISIONS, revisions), (T.AGGREGATES, revisions[1:])):
        spark.createDataFrame(rows, T.AGGREGATES_SCHEMA).write.format("delta").mode("append").saveAsTable(
            in_test_database(table)
        )
    ledger = [(1, "published", "load", HOUR, loaded, None, None, None, '["2026-11-22T12"]', None, None),
              (2, "staged", "load", HOUR, loaded, None, None, None, None, None, None)]
    spark.createDataFrame(ledger, T.LOAD_RUNS_SCHEMA).write.format("delta").mode("append").saveAsTable(
        in_test_database(T.LOAD_RUNS)
    )
    for sql in (T.LATE_CORRECTIONS_SQL, T.CROSS_REGION_SQL, *(T.whole_view_sql(name) for name in T.PUBLISHED)):
        spark.sql(in_test_database(sql))
    yield spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:")
    spark.sql(f"DROP DATABASE IF EXISTS {DATABASE} CASCADE")


def test_each_view_has_the_pages_columns(spark: SparkSession, tables: str) -> None:
    views = {}
    for row in table_rows(doc_sections(TABLES_MD, level=3)["The views"]):
        names = re.findall(r"`([^`]+)`", row[0])
        columns = re.findall(r"`([^`]+)`", row[1]) or None  # None: "the table's"
        views.update({name: columns for name in names})
    code_views = {T.whole_view(name): name for name in T.PUBLISHED} | {T.LATE_CORRECTIONS: None,
                                                                      T.CROSS_REGION_DUPLICATES: None}
    assert sorted(views) == sorted(code_views)
    for view, table in code_views.items():
        expected = spark.table(in_test_database(table)).columns if table else views[view]
        assert spark.table(in_test_database(view)).columns == expected, view


@pytest.mark.parametrize("sql", [block for what, block in checked_blocks(TABLES_MD) if what == "spark-sql"])
def test_each_spark_sql_query_runs(spark: SparkSession, tables: str, sql: str) -> None:
    """Analysed (every table, view, column and type resolved; a command
    such as DESCRIBE HISTORY run), not executed: two rows' answers would
    say nothing more, at seconds of Spark jobs each."""
    assert spark.sql(in_test_database(sql)).schema.fields


def test_the_query_without_spark_reads_the_whole_hour(tables: str) -> None:
    [block] = [block for what, block in checked_blocks(TABLES_MD) if what == "deltalake"]
    code = block.replace('warehouse = ".adpipe/warehouse"', f"warehouse = {tables!r}")
    code = code.replace("/ads.db/", f"/{DATABASE}.db/").replace("print(per_ad.to_pandas())", "")
    assert code != block
    namespace: dict = {}
    exec(compile(code, "docs/tables.md", "exec"), namespace)  # noqa: S102 - the page's own example
    assert namespace["per_ad"].to_pylist() == [{"ad_id": "ad-000042", "impressions": 100, "clicks": 1}]


def test_the_spark_sql_command_has_adpipes_own_settings() -> None:
    """Each ``--conf`` of the page's spark-sql command is the value adpipe's
    own metastore sessions use, for the local defaults run from the checkout."""
    from adpipe.lakehouse.metastore import metastore_conf
    from adpipe.settings import PROJECT_ROOT, load_settings
    from adpipe.spark import spark_conf

    settings = load_settings({})
    code = spark_conf(settings, "a-reader", metastore_conf(settings))
    [block] = [block for what, block in checked_blocks(TABLES_MD) if what == "spark-sql-command"]
    confs = dict(re.findall(r"--conf (\S+?)=(\S+)", block.replace("$PWD", str(PROJECT_ROOT))))
    assert len(confs) >= 10
    assert {key: code.get(key) for key in confs} == confs
