"""The drivers' class-data-sharing archive (adpipe.class_archive): trained by
``make jars`` for both driver classpaths, named in every driver's options,
left out where the user runs class sharing their own way, and really mapped
by a driver's JVM (its classes come from the archive, by the JVM's own log)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from adpipe import class_archive
from adpipe.lakehouse.metastore import driver_class_path, metastore_conf
from adpipe.settings import load_settings
from adpipe.spark import spark_conf

PROBE = """
from adpipe.settings import load_settings
from adpipe.spark import build_spark
import os
spark = build_spark(load_settings(os.environ), "class-archive-probe")
assert spark.range(1000).selectExpr("sum(id) as s").first()["s"] == 499500
spark.stop()
"""


def test_make_jars_trained_an_archive_per_driver_classpath_and_every_driver_names_its_own() -> None:
    settings = load_settings({})
    plain, metastore = (class_archive.archive_path(settings, prefix) for prefix in ("", driver_class_path(settings)))
    assert plain is not None and metastore is not None and plain != metastore
    assert plain.is_file() and metastore.is_file(), "make jars trains both (adpipe jars)"
    assert f"-XX:SharedArchiveFile={plain}" in spark_conf(settings, "x")["spark.driver.extraJavaOptions"]
    with_metastore = spark_conf(settings, "x", metastore_conf(settings))["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={metastore}" in with_metastore and str(plain) not in with_metastore
    assert "-Xlog:cds=off" in with_metastore  # a mismatch never prints into a command's output


@pytest.mark.parametrize("option", ["-Xshare:off", "-XX:SharedArchiveFile=/elsewhere.jsa"])
def test_class_sharing_set_by_the_user_is_left_alone(option: str) -> None:
    settings = load_settings({"ADPIPE_JVM_OPTIONS": option})
    java_options = spark_conf(settings, "x")["spark.driver.extraJavaOptions"]
    assert class_archive.driver_options(settings, "") == []
    assert java_options.count("SharedArchiveFile") == option.count("SharedArchiveFile")


def test_a_driver_maps_spark_classes_from_the_archive(tmp_path: Path) -> None:
    loads = tmp_path / "class-load.log"
    env = {
        **os.environ,
        "ADPIPE_HOME": str(tmp_path / "home"),
        "ADPIPE_JVM_OPTIONS": f"-Xlog:class+load=info:file={loads}",
        "ADPIPE_SPARK_MASTER": "local[1]",
    }
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)  # noqa: S603
    assert done.returncode == 0, done.stderr[-3000:]
    spark_classes = [line for line in loads.read_text().splitlines() if " org.apache.spark.sql." in line]
    shared = [line for line in spark_classes if "shared objects file (top)" in line]
    assert len(spark_classes) > 1000
    assert len(shared) > 0.5 * len(spark_classes), f"{len(shared)} of {len(spark_classes)} from the archive"
