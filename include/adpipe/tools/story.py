"""What a tool prints for a person watching it (``adpipe demo``): a line or
two per step, a progress bar while a long step runs, and a closing table.

Bars are drawn (with rich, on stderr) only when stderr is a terminal, and
vanish when their step ends; elsewhere (CI, tests, a pipe) a step prints its
plain lines and nothing more."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO


class Bar:
    """One running step's progress. Without a terminal it does nothing."""

    def __init__(self, progress: Any = None, task: Any = None) -> None:
        self._progress, self._task = progress, task

    def update(self, completed: float | None = None, total: float | None = None, status: str | None = None) -> None:
        """What is known so far: ``completed`` of ``total`` (records,
        messages), and a short ``status`` shown beside the bar."""
        if self._progress is None:
            return
        fields = {} if status is None else {"status": status}
        self._progress.update(self._task, completed=completed, total=total, **fields)


class Story:
    """Numbered steps on ``out`` (stdout), each with a note or two, and the
    bars of long steps on stderr when it is a terminal."""

    def __init__(self, out: TextIO | None = None, bars: bool | None = None) -> None:
        self.out = out or sys.stdout
        self.bars = sys.stderr.isatty() if bars is None else bars
        self.steps = 0

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def step(self, text: str) -> None:
        self.steps += 1
        self.say(f"{self.steps}. {text}")

    def note(self, text: str) -> None:
        self.say("   " + text.replace("\n", "\n   "))

    @contextmanager
    def progress(self, description: str, total: float | None = None) -> Iterator[Bar]:
        """A bar while the block runs: a pulsing one with the time elapsed
        when ``total`` is unknown (a Spark job starting, a load)."""
        if not self.bars:
            yield Bar()
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(
            SpinnerColumn(),
            TextColumn("   {task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
            # Our own lines are printed between steps, never under a bar.
            redirect_stdout=False,
            redirect_stderr=False,
        ) as progress:
            yield Bar(progress, progress.add_task(description, total=total, status=""))


def render_table(title: str, rows: Sequence[tuple[str, str]]) -> str:
    """Two columns, what and how many, under ``title``; a value of several
    lines continues under its first."""
    width = max(len(key) for key, _ in rows)
    lines = []
    for key, value in rows:
        first, *rest = value.splitlines() or [""]
        lines.append(f"  {key:<{width}}  {first}")
        lines += [f"  {'':<{width}}  {line}" for line in rest]
    rule = "-" * max(len(title), *(len(line) for line in lines))
    return "\n".join([title, rule, *lines, rule])
