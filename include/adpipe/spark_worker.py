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

Run as ``python -m adpipe.spark_worker`` by Spark, never by hand.

Spark also starts Python processes of its own module, not from a daemon:
the stream job's stateful operator has the driver run its ``init`` in a
fresh ``pyspark.sql.streaming.transform_with_state_driver_worker`` at the
start of every query, on the path of the first batch: 0.87 s of wall
(async-profiler), half of it Python compiling pyspark from the zip again.
:func:`worker_python` writes the interpreter a local session gives Spark: a
shell shim that leaves the installed pyspark's own zips out of
``PYTHONPATH``, then runs this environment's Python (which has the same
pyspark and py4j installed)."""

from __future__ import annotations

import hashlib
import importlib
import os
import shlex
import sys
from importlib.machinery import PathFinder
from pathlib import Path

from adpipe import pygc

# Set by a job (spark.executorEnv.*): its modules, imported before the fork.
WORKER_IMPORTS_ENV = "ADPIPE_WORKER_IMPORTS"
# What every adpipe worker uses (Arrow hand-over, pandas operators).
LIBRARIES = ("numpy", "pandas", "pyarrow", "pyarrow.compute", "pyarrow.ipc")


def _installed(path: list[str]) -> list[str]:
    """``path`` without its zips: where installed packages are found."""
    return [p for p in path if not p.endswith(".zip")]


def _own_zip_dir(path: list[str]) -> Path | None:
    """Where the zips of the pyspark installed on ``path`` are (``<pyspark>/python/lib``)."""
    spec = PathFinder.find_spec("pyspark", _installed(path))
    if spec is None or not spec.submodule_search_locations:
        return None
    return (Path(next(iter(spec.submodule_search_locations))) / "python" / "lib").resolve()


def installed_pyspark_first(path: list[str]) -> list[str]:
    """``path`` with Spark's zips (``pyspark.zip``, ``py4j-*.zip``) moved to
    its end when they are the installed pyspark's own (``<pyspark>/python/lib``):
    the same code, compiled. Zips of another Spark stay where they were."""
    own_lib = _own_zip_dir(path)
    if own_lib is None:
        return path
    own = [p for p in path if p.endswith(".zip") and Path(p).parent.resolve() == own_lib]
    return [p for p in path if p not in own] + own


_SHIM = """#!/bin/sh
# Written by adpipe (adpipe.spark_worker.worker_python): one file per content.
# Spark's Python for a local session: PYTHONPATH without the installed
# pyspark's own zips (the same code, installed and compiled, and entries of
# PYTHONPATH come before the installed packages), then {python} runs with
# the arguments given.
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
  case $entry in
    {patterns}) ;;
    *) kept=${{kept:+$kept:}}$entry ;;
  esac
done
unset IFS
PYTHONPATH=$kept
export PYTHONPATH
exec {python} "$@"
"""


def shim_text(python: str, zip_paths: list[str]) -> str:
    """The shell shim of :func:`worker_python`: ``zip_paths`` (exactly as
    Spark names them) left out of ``PYTHONPATH``, then ``python``."""
    patterns = "|".join(shlex.quote(p) for p in zip_paths) or "''"
    return _SHIM.format(python=shlex.quote(python), patterns=patterns)


def worker_python(folder: Path, spark_home: str) -> str:
    """The interpreter for Spark's Python processes of a local session: a
    shim in ``folder`` when the zips Spark puts first on their path
    (``<spark_home>/python/lib/*.zip``) are the installed pyspark's own, else
    this interpreter. Written once per content (its name is a digest of it),
    atomically; a folder that cannot be written leaves this interpreter."""
    lib = Path(spark_home) / "python" / "lib"
    if not lib.is_dir() or lib.resolve() != _own_zip_dir(sys.path):
        return sys.executable
    # Only the zips of what is installed too: pyspark (checked above), py4j.
    py4j = PathFinder.find_spec("py4j", _installed(sys.path)) is not None
    zips = sorted(
        str(lib / name) for name in os.listdir(lib) if name == "pyspark.zip" or (py4j and name.startswith("py4j"))
    )
    # Spark joins SPARK_HOME as given; match the resolved path too.
    names = sorted({*zips, *(str(Path(z).resolve()) for z in zips)})
    text = shim_text(sys.executable, names)
    shim = folder / f"spark-python-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if shim.is_file():
        return str(shim)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = shim.with_name(f"{shim.name}.{os.getpid()}.tmp")
        partial.write_text(text)
        partial.chmod(0o755)
        partial.replace(shim)
    except OSError:
        return sys.executable
    return str(shim)


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
