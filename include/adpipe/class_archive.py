"""A class-data-sharing archive for Spark drivers: a cold JVM loads and
verifies some 17,000 classes (Spark SQL, Delta, the Hive client) before and
during its first queries; mapped from an archive, a short session with a
Delta write, read and MERGE took 24.7 s instead of 31.0 s here.

``adpipe jars`` (``make jars``) trains one archive per driver classpath
layout (plain, and with the PostgreSQL driver first for the Hive metastore)
with :mod:`adpipe.tools.class_archive_training`, into the path named here.
This module names the archives and maps them, and launches nothing: the
training's workloads use the lakehouse, which a shared module may not reach.
:func:`driver_options` adds it to a driver's options when the archive of its
layout, JVM and Spark exists. The JVM checks the archive itself (its JVM
build, classpath and jars) and runs without it on any mismatch, so a stale
archive costs speed, never correctness; its messages are turned off so that
they never reach a command's output."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from adpipe.jars import java_home, postgres_jdbc_jar, pyspark_jars
from adpipe.settings import Settings

QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
# Options that mean the user runs class sharing their own way.
_USER_SHARING = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")
LAYOUTS = ("plain", "metastore")
# The training's workload: a new one names new archives (the old are pruned).
WORKLOAD_VERSION = 2


def archive_path(settings: Settings, extra_class_path: str) -> Path | None:
    """The archive for a driver whose classpath starts with
    ``extra_class_path`` (Spark's ``spark.driver.extraClassPath``), named by
    what it depends on: the JVM build, that prefix, Spark's own jars and
    adpipe's extra ones.
    None when the JVM's library cannot be found."""
    home = java_home()
    libjvm = home / "lib" / "server" / "libjvm.so" if home else None
    if libjvm is None or not libjvm.is_file():
        return None
    digest = hashlib.sha256()
    stat = libjvm.stat()
    digest.update(f"{libjvm.resolve()}:{stat.st_size}:{stat.st_mtime_ns}\n{extra_class_path}\n".encode())
    digest.update(f"workload {WORKLOAD_VERSION}\n".encode())
    for jars in (pyspark_jars(), settings.jar_cache / "spark"):  # Spark's own, then spark.jars
        for name in sorted(os.listdir(jars)) if jars.is_dir() else []:
            digest.update(f"{name}:{(jars / name).stat().st_size}\n".encode())
    return settings.jar_cache / "cds" / f"driver-{digest.hexdigest()[:16]}.jsa"


def missing(settings: Settings) -> list[str]:
    """The layouts whose archive is not trained yet."""
    return [
        layout for layout in LAYOUTS
        if not (path := archive_path(settings, layout_class_path(settings, layout))) or not path.is_file()
    ]


def prune(settings: Settings) -> list[Path]:
    """Remove the archives of other JVMs, classpaths or Spark versions than
    the current ones; returns what was removed."""
    current = {archive_path(settings, layout_class_path(settings, layout)) for layout in LAYOUTS}
    stale = [p for p in sorted((settings.jar_cache / "cds").glob("driver-*.jsa")) if p not in current]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def driver_options(settings: Settings, extra_class_path: str) -> list[str]:
    """The JVM options that map the archive of this driver's layout, or
    none (no archive yet, or class sharing set in ADPIPE_JVM_OPTIONS)."""
    if any(marker in option for option in settings.jvm_options for marker in _USER_SHARING):
        return []
    path = archive_path(settings, extra_class_path)
    if path is None or not path.is_file():
        return []
    return [f"-XX:SharedArchiveFile={path}", *QUIET]


def layout_class_path(settings: Settings, layout: str) -> str:
    """What the driver classpath of ``layout`` starts with: nothing, or the
    PostgreSQL JDBC driver (a Hive metastore driver's, adpipe.lakehouse.metastore)."""
    return "" if layout == "plain" else str(postgres_jdbc_jar(settings.jar_cache))
