"""The committed corpus of bad raw values (tests/data/raw_events)."""

from __future__ import annotations

from pathlib import Path

CORPUS_DIR = Path(__file__).parent / "data" / "raw_events"


def bad_raw_values() -> list[tuple[str, str, bytes]]:
    """(case, expected reason, value) of every file, sorted by case."""
    found = [(path.stem, path.parent.name, path.read_bytes()) for path in CORPUS_DIR.glob("*/*.bin")]
    return sorted(found)
