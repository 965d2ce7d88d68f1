"""Spark's Python workers fork from adpipe's daemon (adpipe.spark_worker):
pyspark from the installed package, the libraries and a job's modules
imported before the fork."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest
from adpipe.spark_worker import installed_pyspark_first, preload, shim_text, worker_python
from pyspark.sql import SparkSession

INSTALLED = Path(pyspark.__file__).parent
SITE = str(INSTALLED.parent)


def test_the_installed_pysparks_own_zips_go_last_another_sparks_stay_first() -> None:
    lib = INSTALLED / "python" / "lib"
    own = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    assert installed_pyspark_first([*own, "/work/include", SITE]) == ["/work/include", SITE, *own]
    other = ["/opt/spark/python/lib/pyspark.zip", "/opt/spark/python/lib/py4j-0.10.9.9-src.zip"]
    assert installed_pyspark_first([*other, SITE]) == [*other, SITE]
    # No pyspark outside the zips: the path as it was.
    assert installed_pyspark_first([*own, "/nowhere"]) == [*own, "/nowhere"]


def test_preload_names_what_it_could_not_import() -> None:
    assert preload("json, adpipe.no_such_module,") == ["adpipe.no_such_module"]
    assert "pyarrow.compute" in sys.modules


def _worker_facts(batches):  # noqa: ANN001, ANN202 - runs in a Spark Python worker
    import sys

    import pyarrow as pa
    import pyspark

    main = sys.modules["__main__"]
    facts = {
        "daemon": getattr(main.__spec__, "name", None),
        "pyspark": pyspark.__file__,
        "preloaded": "pyarrow.compute" in sys.modules,
    }
    for _ in batches:
        yield pa.RecordBatch.from_pydict({"facts": [json.dumps(facts)]})


def test_a_python_worker_forks_from_adpipes_daemon_with_the_jobs_modules_loaded(spark: SparkSession) -> None:
    # The daemon preloads the libraries every worker uses (adpipe.spark_worker.LIBRARIES).
    rows = spark.range(2, numPartitions=2).mapInArrow(_worker_facts, "facts string").collect()
    facts = [json.loads(row.facts) for row in rows]
    assert facts and all(f["daemon"] == "adpipe.spark_worker" for f in facts)
    assert all(Path(f["pyspark"]).parent == INSTALLED for f in facts)  # not pyspark.zip/pyspark
    assert all(f["preloaded"] for f in facts)


def _run_shim(shim: Path, python_path: str, *args: str) -> tuple[str, list[str]]:
    code = "import os, sys, json; print(json.dumps([os.environ['PYTHONPATH'], sys.argv[1:]]))"
    done = subprocess.run(
        [str(shim), "-c", code, *args], env={"PYTHONPATH": python_path, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    )
    seen, argv = json.loads(done.stdout)
    return seen, argv


def test_the_shim_leaves_the_named_zips_out_of_the_path_and_passes_every_argument(tmp_path: Path) -> None:
    zips = ["/opt/py spark/python/lib/pyspark.zip", "/opt/py spark/python/lib/py4j-0.10.9.9-src.zip"]
    shim = tmp_path / "it's python"
    shim.write_text(shim_text(sys.executable, zips))
    shim.chmod(0o755)
    path = f"/a/*:{zips[0]}:/b c:{zips[1]}:/opt/py spark/python/lib/other.zip"
    seen, argv = _run_shim(shim, path, "two words", "*", "$HOME")
    assert seen == "/a/*:/b c:/opt/py spark/python/lib/other.zip"  # in order, no glob, nothing else dropped
    assert argv == ["two words", "*", "$HOME"]
    assert _run_shim(shim, zips[0]) == ("", [])


def test_a_local_session_gets_the_shim_only_for_the_installed_pysparks_own_zips(tmp_path: Path) -> None:
    shim = worker_python(tmp_path / "python", str(INSTALLED))
    assert Path(shim).parent == tmp_path / "python" and os.access(shim, os.X_OK)
    assert worker_python(tmp_path / "python", str(INSTALLED)) == shim  # written once
    own = INSTALLED / "python" / "lib"
    seen, _ = _run_shim(Path(shim), f"{own / 'pyspark.zip'}:/x:{own.resolve() / 'py4j-0.10.9.9-src.zip'}")
    assert seen == "/x"
    other = tmp_path / "spark" / "python" / "lib"
    other.mkdir(parents=True)
    (other / "pyspark.zip").write_bytes(b"")
    assert worker_python(tmp_path / "python", str(tmp_path / "spark")) == sys.executable
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anyway
        assert worker_python(read_only / "python", str(INSTALLED)) == sys.executable


def _worker_path(batches):  # noqa: ANN001, ANN202 - runs in a Spark Python worker
    import os

    import pyarrow as pa

    for _ in batches:
        yield pa.RecordBatch.from_pydict({"path": [os.environ.get("PYTHONPATH", "")]})


def test_a_local_sessions_python_workers_start_without_pysparks_zips(spark: SparkSession) -> None:
    if not Path(os.environ["PYSPARK_PYTHON"]).name.startswith("spark-python-"):
        pytest.skip(f"PYSPARK_PYTHON set outside adpipe: {os.environ['PYSPARK_PYTHON']}")
    rows = spark.range(1).mapInArrow(_worker_path, "path string").collect()
    assert rows and not any(entry.endswith(".zip") for entry in rows[0].path.split(":"))
