"""Installing the peers of ``make bench``: quixstreams and PyFlink, each in
a virtual environment of its own under ``.cache/bench/<peer>``, and the
Flink Kafka SQL connector jar from Maven Central beside them. Pinned, so a
second run needs no network."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

from adpipe.settings import Settings

# What `make bench` installs, each into .cache/bench/<venv>: pinned, so a
# second run needs no network.
VENVS = {"quixstreams": ("quixstreams==3.28.1",), "pyflink": ("apache-flink==2.3.0",)}
FLINK_CONNECTOR = ("org.apache.flink", "flink-sql-connector-kafka", "5.0.0-2.2")
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"


def bench_cache(settings: Settings) -> Path:
    """``.cache/bench`` beside the JVM jar cache."""
    return settings.jar_cache.parent / "bench"


def venv_python(cache: Path, venv: str) -> Path:
    return cache / venv / "bin" / "python"


def ensure_venv(cache: Path, venv: str, requirements: Sequence[str]) -> Path:
    """A virtual environment with ``requirements`` under ``cache/venv``,
    made once: a stamp holds what was installed, so a rerun does nothing."""
    stamp = cache / venv / ".installed"
    wanted = "\n".join(requirements)
    python = venv_python(cache, venv)
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    print(f"installing {', '.join(requirements)} into {cache / venv} (once)", flush=True)
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(cache / venv)], check=True)  # noqa: S603
    subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True)  # noqa: S603
    stamp.write_text(wanted)
    return python


def maven_url(group: str, artifact: str, version: str) -> str:
    return f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"


def ensure_jar(cache: Path, coordinates: tuple[str, str, str] = FLINK_CONNECTOR) -> Path:
    """A jar from Maven Central into ``cache``, once, checked against the
    SHA-1 Maven Central publishes beside it."""
    group, artifact, version = coordinates
    jar = cache / f"{artifact}-{version}.jar"
    if jar.exists():
        return jar
    url = maven_url(group, artifact, version)
    print(f"downloading {url}", flush=True)
    cache.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url + ".sha1", timeout=60) as response:  # noqa: S310 - a fixed https URL
        expected = response.read().decode().split()[0]
    with urllib.request.urlopen(url, timeout=300) as response:  # noqa: S310
        body = response.read()
    if hashlib.sha1(body).hexdigest() != expected:  # noqa: S324 - Maven Central's own checksum
        raise RuntimeError(f"{url}: SHA-1 does not match Maven Central's {expected}")
    tmp = jar.with_suffix(".part")
    tmp.write_bytes(body)
    tmp.replace(jar)
    return jar


def ensure_peers(settings: Settings, engines: Iterable[str]) -> dict[str, Path]:
    """Install what the chosen rows need; return the peers' interpreters
    (and the Flink connector jar under ``flink_jar``)."""
    cache = bench_cache(settings)
    found: dict[str, Path] = {}
    for engine in engines:
        if engine in VENVS:
            found[engine] = ensure_venv(cache, engine, VENVS[engine])
    if "pyflink" in found:
        found["flink_jar"] = ensure_jar(cache)
    return found
