"""The gate's Great Expectations context: file-backed under
``settings.home / "gx"``, with a data source per engine (Spark, pandas), a
data asset and batch definition per gate in each, and per gate a suite,
validation definition and checkpoint bound to the engine of the run, created
or updated on every run under a file lock (GE's stores do get-then-add, so two
processes would race on "already exists"). Each checkpoint's
``UpdateDataDocsAction`` rebuilds the HTML Data Docs of the local site."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from adpipe.lakehouse.quality.report import EXAMPLES
from adpipe.lakehouse.quality.suites import GATES, PANDAS, SPARK
from adpipe.settings import Settings

DATASOURCES = {SPARK: "adpipe_spark", PANDAS: "adpipe_pandas"}
BATCH_DEFINITION = "whole_dataframe"
DOCS_SITE = "local_site"
# The Data Docs index lists this many newest validation results. GE rebuilds
# the index after every checkpoint run by reading every stored result: left
# unbounded, an hourly gate (three results an hour) pays for its whole
# history each time. Older pages stay on disk, linked from each hour's page
# (adpipe.orchestration.load_tasks.publish_data_docs).
DOCS_INDEX_LIMIT = 500


def gx_root(settings: Settings) -> Path:
    return settings.home / "gx"


@contextmanager
def context_lock(settings: Settings) -> Iterator[None]:
    """Serialize GE work on one ``ADPIPE_HOME``: GE's file stores do
    get-then-add (a second process would fail on "already exists") and
    rewrite great_expectations.yml and the Data Docs index in place."""
    settings.home.mkdir(parents=True, exist_ok=True)
    with open(settings.home / "gx.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def set_up_checkpoints(settings: Settings, engine: str = SPARK) -> tuple[Any, dict[str, Any]]:
    """The file context and one checkpoint per gate on ``engine``'s data
    source, created or updated (a checkpoint keeps its name on both)."""
    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="file", project_root_dir=str(settings.home))
    # Read back from great_expectations.yml this is a plain dict.
    progress_bars = context.variables.progress_bars
    if isinstance(progress_bars, dict):
        progress_bars_off = progress_bars.get("globally") is False
    else:
        progress_bars_off = getattr(progress_bars, "globally", None) is False
    if not progress_bars_off:
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        context.variables.save()
    _limit_the_docs_index(context)

    # Not add_or_update_*: updating a data source replaces it with one
    # without assets, which breaks the stored batch definitions' references.
    name = DATASOURCES[engine]
    if name in context.data_sources.all():
        datasource = context.data_sources.get(name)
    elif engine == PANDAS:
        datasource = context.data_sources.add_pandas(name=name)
    else:
        datasource = context.data_sources.add_spark(name=name)

    checkpoints: dict[str, Any] = {}
    for gate in GATES:
        try:
            asset = datasource.get_asset(gate.name)
        except LookupError:
            asset = datasource.add_dataframe_asset(name=gate.name)
        try:
            batch_definition = asset.get_batch_definition(BATCH_DEFINITION)
        except KeyError:
            batch_definition = asset.add_batch_definition_whole_dataframe(BATCH_DEFINITION)
        suite = gx.ExpectationSuite(name=gate.name, expectations=gate.expectations(engine))
        suite = context.suites.add_or_update(suite)
        validation = context.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=gate.name, data=batch_definition, suite=suite)
        )
        checkpoints[gate.name] = context.checkpoints.add_or_update(
            gx.Checkpoint(
                name=gate.name,
                validation_definitions=[validation],
                actions=[UpdateDataDocsAction(name="update_data_docs", site_names=[DOCS_SITE])],
                result_format={
                    "result_format": "SUMMARY",
                    "unexpected_index_column_names": list(gate.index_columns),
                    "partial_unexpected_count": EXAMPLES,
                },
            )
        )
    return context, checkpoints


def _limit_the_docs_index(context: Any) -> None:
    """The local site's index lists the newest DOCS_INDEX_LIMIT results."""
    sites = dict(context.variables.data_docs_sites or {})
    site = dict(sites.get(DOCS_SITE) or {})
    builder = dict(site.get("site_index_builder") or {"class_name": "DefaultSiteIndexBuilder"})
    if not site or builder.get("validation_results_limit") == DOCS_INDEX_LIMIT:
        return
    builder["validation_results_limit"] = DOCS_INDEX_LIMIT
    sites[DOCS_SITE] = {**site, "site_index_builder": builder}
    context.variables.data_docs_sites = sites
    context.variables.save()


def docs_site(settings: Settings) -> Path | None:
    """The local Data Docs site's folder, once a validation has built it."""
    site = gx_root(settings) / "uncommitted" / "data_docs" / DOCS_SITE
    return site if (site / "index.html").exists() else None


def docs_index(context: Any) -> Path | None:
    for site in context.get_docs_sites_urls(site_name=DOCS_SITE) or []:
        url = site.get("site_url")
        if url and url.startswith("file://"):
            path = Path(unquote(urlparse(url).path))
            if path.exists():
                return path
    return None
