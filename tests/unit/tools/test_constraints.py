"""adpipe.tools.constraints: Airflow's constraints less the project's own pins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from adpipe.settings import PROJECT_ROOT
from adpipe.tools.constraints import canonical_name, constraints_without, derived_constraints, requirement_names

REQUIREMENTS = """\
# a comment
pyspark==4.1.3
Delta_Spark==4.4.1  # trailing comment
great-expectations[spark]==1.24.1
SQLAlchemy>=1.4,<3
-r other.txt
--index-url https://pypi.example/simple

"""

AIRFLOW_CONSTRAINTS = """\
#
# This constraints file was automatically generated
#
SQLAlchemy==1.4.54
delta.spark==3.0.0
grpcio==1.76.0
numpy==1.26.4
pyspark==4.0.0
"""


def test_canonical_names_follow_pep_503() -> None:
    assert {canonical_name(n) for n in ("Delta_Spark", "delta-spark", "delta.spark", "DELTA--spark")} == {"delta-spark"}


def test_requirement_names_skip_comments_and_options() -> None:
    names = requirement_names(REQUIREMENTS.splitlines())
    assert names == {"pyspark", "delta-spark", "great-expectations", "sqlalchemy"}


def test_the_projects_pins_win_and_the_rest_is_held_to_airflows() -> None:
    pinned = requirement_names(REQUIREMENTS.splitlines())
    assert constraints_without(AIRFLOW_CONSTRAINTS.splitlines(), pinned) == ["grpcio==1.76.0", "numpy==1.26.4"]


def test_without_airflows_file_nothing_is_constrained(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(REQUIREMENTS)
    text = derived_constraints(requirements, "")
    assert [line for line in text.splitlines() if not line.startswith("#")] == []


def test_runs_before_anything_is_installed(tmp_path: Path) -> None:
    """As the Makefile runs it: PYTHONPATH=include, the standard library only
    (python -I -S: no site-packages, so no installed adpipe either)."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(REQUIREMENTS)
    airflow = tmp_path / "constraints-3.11.txt"
    airflow.write_text(AIRFLOW_CONSTRAINTS)
    out = tmp_path / "cache" / "constraints.txt"
    code = (
        f"import sys; sys.path.insert(0, {str(PROJECT_ROOT / 'include')!r}); "
        "from adpipe.tools.constraints import main; "
        f"sys.exit(main(['--requirements', {str(requirements)!r}, '--airflow-constraints', {str(airflow)!r}, "
        f"'--out', {str(out)!r}]))"
    )
    subprocess.run([sys.executable, "-I", "-S", "-c", code], check=True)
    lines = out.read_text().splitlines()
    assert [line for line in lines if not line.startswith("#")] == ["grpcio==1.76.0", "numpy==1.26.4"]
    assert str(airflow) in lines[0]
