"""Spark's Python worker daemon for adpipe's jobs (``spark.python.daemon.module``):
pyspark's own daemon, with what every worker imports imported once, before
it forks the workers.

Spark starts one daemon per executor and worker environment, and the daemon
forks a process per Python task slot. With pyspark's daemon each forked
worker imported pandas, pyarrow, numpy and the job's module on its first
task, and the daemon and every worker read pyspark from ``pyspark.zip``,
which Spark puts first on a worker's path and from which Python compiles
every module again (a zip holds no compiled files): about 0.7 s for the
daemon and 0.3-0.4 s per worker of the first micro-batch after a start, on
this machine. Here the daemon imports pyspark from the installed package
(compiled once by pip) when the zip is that package's own, then the
libraries and the modules named in ``ADPIPE_WORKER_IMPORTS`` (a job sets it
with ``spark.executorEnv``); its forks start with all of them loaded.

Run as ``python -m adpipe.spark_worker`` by Spark, never by hand."""

from __future__ import annotations

import importlib
import os
import sys
from importlib.machinery import PathFinder
from pathlib import Path

from adpipe import pygc

# Set by a job (spark.executorEnv.*): its modules, imported before the fork.
WORKER_IMPORTS_ENV = "ADPIPE_WORKER_IMPORTS"
# What every adpipe worker uses (Arrow hand-over, pandas operators).
LIBRARIES = ("numpy", "pandas", "pyarrow", "pyarrow.compute", "pyarrow.ipc")


def installed_pyspark_first(path: list[str]) -> list[str]:
    """``path`` with Spark's zips (``pyspark.zip``, ``py4j-*.zip``) moved to
    its end when they are the installed pyspark's own (``<pyspark>/python/lib``):
    the same code, compiled. Zips of another Spark stay where they were."""
    spec = PathFinder.find_spec("pyspark", [p for p in path if not p.endswith(".zip")])
    if spec is None or not spec.submodule_search_locations:
        return path
    own_lib = (Path(next(iter(spec.submodule_search_locations))) / "python" / "lib").resolve()
    own = [p for p in path if p.endswith(".zip") and Path(p).parent.resolve() == own_lib]
    return [p for p in path if p not in own] + own


def preload(modules: str) -> list[str]:
    """Import the libraries and the comma-separated ``modules``; the names
    that failed (a worker then imports them itself, and says why there)."""
    failed = []
    for name in (*LIBRARIES, *filter(None, (m.strip() for m in modules.split(",")))):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a worker without it still runs
            failed.append(name)
    return failed


def main() -> None:
    sys.path[:] = installed_pyspark_first(sys.path)
    from pyspark import daemon  # imports pyspark.worker

    failed = preload(os.environ.get(WORKER_IMPORTS_ENV, ""))
    if failed:
        print(f"adpipe.spark_worker: could not preload {', '.join(failed)}", file=sys.stderr)
    # Every fork starts with the preloaded objects frozen and collects its
    # young less often: the workers' CPU over make bench's 1M topic 4.7 -> 4.2 s.
    pygc.tune_for_batches()
    daemon.manager()


if __name__ == "__main__":
    main()
