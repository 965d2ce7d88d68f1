"""JVM artifacts from Maven Central, cached in the project's own folder.

Three classpaths are needed: the Apache Kafka broker (run from its jars),
the extra jars of the pip-installed Spark (the Kafka source and Delta Lake)
and the HDFS NameNode and DataNode of ``adpipe hdfs up``. Each is resolved
by Maven from the poms beside this module, once; afterwards the cache
under ``.cache/jvm`` is used and no network is needed.

One jar is adpipe's own (:func:`adpipe_spark_jar`): the Spark functions
under ``jvm/src``, compiled by the JDK's ``javac`` against pyspark's jars,
once per source and Spark version, into the same cache."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

POM_DIR = Path(__file__).parent / "jvm"
JAVA_SOURCES = POM_DIR / "src"
JAVA_RELEASE = "17"  # Spark 4's own
CLASSPATHS = {"kafka": "kafka-broker.pom.xml", "spark": "spark-extras.pom.xml", "hdfs": "hdfs.pom.xml"}
_DOTTED = re.compile(r"\d+\.\d+")


class JarFetchError(RuntimeError):
    """Maven could not resolve a classpath."""


def artifact_name(jar_name: str) -> str:
    """``kafka-clients-3.9.1.jar`` -> ``kafka-clients``.

    The version is the first ``-``-separated part that starts with a digit
    and is followed by no other dotted number: so ``log4j-1.2-api-2.24.3``
    keeps ``1.2`` and ``spark-sql-kafka-0-10_2.13-4.1.3`` keeps ``0-10_2.13``
    in the artifact id, while ``zstd-jni-1.5.6-10`` is ``zstd-jni``."""
    parts = jar_name.removesuffix(".jar").split("-")
    for i, part in enumerate(parts):
        if i and part[:1].isdigit() and not any(_DOTTED.search(p) for p in parts[i + 1 :]):
            return "-".join(parts[:i])
    return "-".join(parts)


def spark_home() -> Path:
    """Spark's home as pyspark hands it to Spark: SPARK_HOME when set (as
    spark-submit sets it), else the pyspark package itself."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home)
    import pyspark

    return Path(pyspark.__file__).parent


def pyspark_jars() -> Path:
    """Spark's jars: under spark-submit pyspark is imported from a zip, but
    SPARK_HOME is set; otherwise they ship inside the pyspark package."""
    jars = spark_home() / "jars"
    if jars.is_dir():
        return jars
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def java_home() -> Path | None:
    """The JVM's home: JAVA_HOME, else the one of ``java`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return Path(home)
    java = shutil.which("java")
    return Path(os.path.realpath(java)).parents[1] if java else None


def _pyspark_jar_artifacts() -> set[str]:
    return {artifact_name(p.name) for p in pyspark_jars().glob("*.jar")}


def classpath_dir(cache: Path, name: str) -> Path:
    return cache / name


def ensure_classpath(cache: Path, name: str) -> list[Path]:
    """Return the jars of classpath ``name``, fetching them on first use."""
    cache = cache.resolve()
    target = classpath_dir(cache, name)
    marker = target / ".complete"
    fingerprint = _fingerprint(name)
    if not marker.exists() or marker.read_text().strip() != fingerprint:
        _fetch(cache, name, target)
        marker.write_text(fingerprint + "\n")
    return sorted(target.glob("*.jar"))


def _fingerprint(name: str) -> str:
    """Changes when the pom (or, for Spark, the installed pyspark) changes."""
    digest = hashlib.sha256((POM_DIR / CLASSPATHS[name]).read_bytes())
    if name == "spark":
        import pyspark

        digest.update(pyspark.__version__.encode())
    return digest.hexdigest()


def _fetch(cache: Path, name: str, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarFetchError("Maven ('mvn') is needed once to fetch jars; install it (apt-get install maven)")
    log.info("fetching the %s classpath from Maven Central into %s", name, target)
    with tempfile.TemporaryDirectory(dir=cache.parent if cache.parent.exists() else None) as tmp:
        out = Path(tmp) / "jars"
        cmd = [
            mvn,
            "-q",
            "-B",
            "-U",
            "-s",
            str(POM_DIR / "maven-settings.xml"),
            "-f",
            str(POM_DIR / CLASSPATHS[name]),
            f"-Dmaven.repo.local={cache / 'm2'}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
        if proc.returncode != 0:
            raise JarFetchError(f"mvn failed for {name}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        jars = sorted(out.glob("*.jar"))
        if name == "spark":
            # pyspark ships Spark and its own dependencies: adding a second,
            # older copy of those (jackson, hadoop, parquet...) would break it.
            provided = _pyspark_jar_artifacts()
            jars = [j for j in jars if artifact_name(j.name) not in provided]
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for jar in jars:
            shutil.copy2(jar, target / jar.name)
    log.info("%s classpath: %d jars", name, len(jars))


def postgres_jdbc_jar(cache: Path) -> Path:
    """The PostgreSQL JDBC driver among the Spark extras (the Hive metastore's)."""
    return next(j for j in ensure_classpath(cache, "spark") if j.name.startswith("postgresql-"))


def _javac() -> str:
    home = java_home()
    javac = home / "bin" / "javac" if home else None
    found = str(javac) if javac and javac.is_file() else shutil.which("javac")
    if found is None:
        raise JarFetchError(
            "a JDK's javac is needed once to build adpipe's Spark functions (include/adpipe/jvm/src); "
            "install one (apt-get install openjdk-17-jdk-headless, or make deps)"
        )
    return found


def adpipe_spark_jar(cache: Path) -> Path:
    """adpipe's own Spark functions (``jvm/src``) as a jar, built on first
    use; named by a digest of the sources and pyspark's version, so a change
    of either builds a new one (older ones are removed)."""
    import pyspark

    sources = sorted(JAVA_SOURCES.rglob("*.java"))
    digest = hashlib.sha256(f"{pyspark.__version__} {JAVA_RELEASE}".encode())
    for source in sources:
        digest.update(str(source.relative_to(JAVA_SOURCES)).encode() + b"\0" + source.read_bytes())
    folder = cache.resolve() / "adpipe"
    jar = folder / f"adpipe-spark-{digest.hexdigest()[:16]}.jar"
    if jar.is_file():
        return jar
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        classes = Path(tmp) / "classes"
        cmd = [_javac(), "--release", JAVA_RELEASE, "-nowarn", "-d", str(classes), "-cp", f"{pyspark_jars()}/*"]
        proc = subprocess.run([*cmd, *map(str, sources)], capture_output=True, text=True, check=False)  # noqa: S603
        if proc.returncode != 0:
            raise JarFetchError(f"javac failed for {JAVA_SOURCES}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        built = Path(tmp) / jar.name
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: adpipe\n\n")
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
        # Atomic: a second process building the same jar at once replaces it with its equal.
        os.replace(built, jar)
    for stale in folder.glob("adpipe-spark-*.jar"):
        if stale != jar:
            stale.unlink(missing_ok=True)
    log.info("built %s from %d Java sources", jar, len(sources))
    return jar
