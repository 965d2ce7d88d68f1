"""Airflow's constraints for the packages requirements.txt leaves free.

``make python-packages`` (the install step of ``make venv`` and of the
Dockerfile) installs requirements.txt under the file this writes. Given
Airflow's constraints file (``AIRFLOW_CONSTRAINTS``: the versions Airflow
was released and tested with, a URL or a file), it keeps every line except
those of the packages requirements.txt names itself: the project's own pins
win (pyspark, delta-spark, great-expectations, confluent-kafka: several are
newer than Airflow's, or absent from its file), and every other package they
or Airflow pull in is held to Airflow's version. Without a constraints file
(the local venv) it writes an empty one, so pip resolves requirements.txt
alone, as it always has here.

Standard library only: it runs before anything is installed, as
``PYTHONPATH=include python -m adpipe.tools.constraints``."""

from __future__ import annotations

import argparse
import re
import sys
import urllib.request
from collections.abc import Iterable
from pathlib import Path

# A requirement's name: letters, digits, ".", "-", "_" up to the first
# extra, version, marker or space (PEP 508).
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical_name(name: str) -> str:
    """PEP 503: ``Delta_Spark`` and ``delta-spark`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(lines: Iterable[str]) -> set[str]:
    """The canonical names of the packages a requirements file names
    (comments, blank lines and pip options such as ``-r`` skipped)."""
    names = set()
    for line in lines:
        text = line.split("#", 1)[0].strip()
        if not text or text.startswith("-"):
            continue
        match = _NAME.match(text)
        if match:
            names.add(canonical_name(match.group(1)))
    return names


def constraints_without(constraint_lines: Iterable[str], pinned: set[str]) -> list[str]:
    """The constraint lines of every package not in ``pinned``."""
    kept = []
    for line in constraint_lines:
        text = line.split("#", 1)[0].strip()
        match = _NAME.match(text)
        if match and canonical_name(match.group(1)) not in pinned:
            kept.append(text)
    return kept


def read_source(source: str) -> str:
    """A constraints file's text, from a URL or a path."""
    if re.match(r"^https?://", source):
        with urllib.request.urlopen(source, timeout=60) as response:  # noqa: S310 - only http(s), checked above
            return response.read().decode()
    return Path(source).read_text()


def derived_constraints(requirements: Path, airflow_constraints: str) -> str:
    """The text of the constraints file for requirements.txt (empty without
    Airflow's)."""
    if not airflow_constraints:
        return "# no Airflow constraints given: requirements.txt alone decides\n"
    pinned = requirement_names(requirements.read_text().splitlines())
    kept = constraints_without(read_source(airflow_constraints).splitlines(), pinned)
    header = (
        f"# Airflow's constraints ({airflow_constraints}) less the packages {requirements.name} names itself:\n"
        f"# {', '.join(sorted(pinned))}\n"
    )
    return header + "".join(f"{line}\n" for line in kept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requirements", type=Path, default=Path("requirements.txt"))
    parser.add_argument("--airflow-constraints", default="", help="Airflow's constraints file: a URL or a path")
    parser.add_argument("--out", type=Path, required=True, help="where to write the constraints pip installs under")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(derived_constraints(args.requirements, args.airflow_constraints))
    return 0


if __name__ == "__main__":
    sys.exit(main())
