"""The README's headline figures are performance.md's: each figure its
opening paragraph quotes (a number with a thousands separator or a decimal
point, or a range) is in docs/performance.md with the same value, so the
front page cannot drift from the measured tables again."""

from __future__ import annotations

import re

from adpipe.settings import PROJECT_ROOT

from tests.unit.helpers import DOCS

README = PROJECT_ROOT / "README.md"
PERFORMANCE = DOCS / "performance.md"

# 58,504 / 6.5 / 5-7 / 17.7 (a bare count such as "2 cores" or "6 s" is a
# setting or a size, not a measured figure).
_NUMBER = r"\d{1,3}(?:,\d{3})+|\d+\.\d+|\d+"
FIGURE = re.compile(rf"(?<![\w.,-])(?:(?:{_NUMBER})-(?:{_NUMBER})|\d{{1,3}}(?:,\d{{3}})+|\d+\.\d+)(?![\w,-]|\.\d)")


def headline(text: str) -> str:
    """The README's opening paragraphs: from the title to the first section."""
    return text.split("\n## ", 1)[0]


def figures(text: str) -> list[str]:
    """The figures in a text, links and code left out (a version, a port
    or a date is no figure)."""
    text = re.sub(r"`[^`]*`|\]\([^)]*\)|\b\d{4}-\d{2}-\d{2}\b", " ", text)
    return FIGURE.findall(text)


def quoted(figure: str, text: str) -> bool:
    return re.search(rf"(?<![\w.,-]){re.escape(figure)}(?![\w,-]|\.\d)", text) is not None


def test_every_headline_figure_of_the_readme_is_performances() -> None:
    found = figures(headline(README.read_text()))
    assert len(found) >= 4, found  # the reader found them: throughput and failover
    performance = PERFORMANCE.read_text()
    missing = [f for f in found if not quoted(f, performance)]
    assert missing == [], f"README.md quotes figures docs/performance.md does not hold: {missing}"


def test_the_readme_points_to_performance() -> None:
    assert "](docs/performance.md" in headline(README.read_text())


def test_the_figure_reader_finds_what_it_means() -> None:
    text = "58,504 events/s (`make bench`, 2026-11-29); p50 6.5 s, 5-7 s, 17.7 s; 2 cores, a 6 s session; v0.6.0"
    assert figures(text) == ["58,504", "6.5", "5-7", "17.7"]
    assert quoted("6.5", "p50 6.5 s") and not quoted("6.5", "16.5 s") and not quoted("6.5", "6.55 s")
    assert not quoted("58,504", "158,504") and not quoted("5-7", "5-70 s")
