"""``python -m bench``: every command line the Makefile gives it parses, it
runs from the project root, the Spark rows' program is found from any
working directory, and the benchmark is no verb of the installed
``adpipe``."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from adpipe.cli import build_parser as adpipe_parser
from adpipe.settings import PROJECT_ROOT

from bench.cli import build_parser
from bench.engines import with_harness_on_path
from tests.unit.helpers import make_dry_run

# The ARGS the Makefile's help names for each target.
MAKE_ARGS = [
    ("bench", ""),
    ("bench", "--ads 10000"),
    ("bench", "--latency"),
    ("bench", "--only adpipe,pyflink"),
    ("bench", "--failover"),
    ("bench", "--failover --part budget --faults 3"),
    ("bench", "--failover --part broker"),
    ("bench", "--failover --hosts 2"),
    ("bench", "--stream-caps 1000 --events 30000"),
    ("bench", "--hour-close --hours 3"),
    ("bench-stages", ""),
    ("bench-stages", "--stream-caps 100000,0"),
    ("bench-stages", "--budget-batch-sizes 250,500"),
]


@pytest.mark.parametrize(("target", "args"), MAKE_ARGS)
def test_every_command_line_of_make_bench_parses(target: str, args: str) -> None:
    lines = [shlex.split(line) for line in make_dry_run(target, f"ARGS={args}") if " -m bench" in line]
    assert lines, f"make {target} runs no python -m bench"
    for words in lines:
        assert words[:3] == [".venv/bin/python", "-m", "bench"], words
        parsed = build_parser().parse_args(words[3:])
        assert parsed.func is not None
    if target == "bench" and args.startswith(("--failover", "--stream-caps", "--hour-close")):  # alone, no peers
        (words,) = lines
        parsed = build_parser().parse_args(words[3:])
        assert (parsed.failover or parsed.stream_caps or parsed.hour_close) and not parsed.peers
    elif target == "bench":  # the peers installed first, the side-by-side run, the alignment's latency, the 10k-ad hour
        first, side_by_side, alignment, wide = (build_parser().parse_args(words[3:]) for words in lines)
        assert first.peers and first.install_only
        assert side_by_side.peers and not side_by_side.install_only
        assert alignment.peers and alignment.latency and alignment.only == "adpipe,adpipe_unaligned"
        assert (wide.peers, wide.events, wide.ads, wide.minutes) == (False, 1_000_000, 10_000, 60)


def _without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_python_m_bench_runs_from_the_project_root() -> None:
    env = {**_without_pythonpath(), "PYTHONPATH": str(PROJECT_ROOT / "include")}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--help"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: python -m bench" in done.stdout and "--peers" in done.stdout


def test_the_spark_rows_program_is_found_from_any_directory(tmp_path: Path) -> None:
    """The driver starts it as ``python -m bench.spark_rows``; the harness is
    not installed, so the child's PYTHONPATH must name the project root."""
    env = with_harness_on_path({**_without_pythonpath(), "PYTHONPATH": str(PROJECT_ROOT / "include")})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PROJECT_ROOT), str(PROJECT_ROOT / "include")]
    done = subprocess.run(
        [sys.executable, "-m", "bench.spark_rows", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "batch" in done.stdout and "alo" in done.stdout


def test_the_benchmark_is_no_verb_of_the_installed_command() -> None:
    with pytest.raises(SystemExit) as exit_info:
        adpipe_parser().parse_args(["bench"])
    assert exit_info.value.code == 2
