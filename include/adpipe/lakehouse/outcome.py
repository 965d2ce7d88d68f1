"""What a load or a repair run reports: its result, the failure of its
gate, and the manifest of each step kept under ``$ADPIPE_HOME/load/runs/``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from adpipe.lakehouse import tables as T
from adpipe.lakehouse.errors import LoadError
from adpipe.lakehouse.handover import write_json
from adpipe.lakehouse.ranges import hour_label
from adpipe.settings import Settings

if TYPE_CHECKING:
    from adpipe.lakehouse.quality import QualityResult
    from adpipe.lakehouse.retention import PastRetention


class GateFailed(LoadError):
    """The audit failed: nothing was published; the message names the expectations."""

    def __init__(self, message: str, results: list[QualityResult]) -> None:
        super().__init__(message)
        self.results = results


def gate_failure(results: list[QualityResult], published: list[str] | None = None) -> GateFailed:
    failed = [r for r in results if not r.success]
    text = "\n".join(r.describe() for r in failed)
    held = ", ".join(hour_label(r.hour) for r in failed)
    done = (f"hours {', '.join(published)} passed and were published" if published
            else "nothing was published")
    return GateFailed(f"the gate failed for {held}: {done}; the failed hours' rows stay staged in "
                      f"{T.STAGING_DATABASE} (held until an operator reloads, repairs or discards them):\n{text}",
                      failed)


@dataclass
class Audit:
    """What a run's audit found: the gate's result of each hour it checked,
    and the hours past the input's retention it did not check
    (:mod:`adpipe.lakehouse.retention`: not failed, not held, not published)."""

    results: list[QualityResult]
    past_retention: list[PastRetention] = field(default_factory=list)

    def passed(self) -> list[str]:
        """The hours whose gate passed: those to publish."""
        return [hour_label(r.hour) for r in self.results if r.success]

    def failed(self) -> list[QualityResult]:
        return [r for r in self.results if not r.success]

    def failed_asked(self, asked: list[str]) -> list[QualityResult]:
        """The failed results of the hours in ``asked`` (those fail the
        command or task; another failed hour is held and alerted)."""
        return [r for r in self.failed() if hour_label(r.hour) in asked]

    def text(self) -> str:
        """The failed hours' results, or every result; then each hour past retention."""
        shown = self.failed() or self.results
        return "\n".join([*(r.describe() for r in shown), *(p.describe() for p in self.past_retention)])

    def summary(self, asked: list[str]) -> dict:
        """What the audit step hands on (beside the run file): whether the
        hours asked passed, the text, the hours passed and those past
        retention, each with its line."""
        return {
            "success": not self.failed_asked(asked),
            "describe": self.text(),
            "passed": self.passed(),
            "past_retention": {p.label: p.describe() for p in self.past_retention},
        }


@dataclass
class LoadResult:
    hour: str
    run_id: int = 0
    hours: list[str] = field(default_factory=list)
    staged: dict[str, int] = field(default_factory=dict)
    inserted: dict[str, int] = field(default_factory=dict)
    corrections: dict[str, int] = field(default_factory=dict)
    gate: list[str] = field(default_factory=list)
    seconds: float = 0.0
    held: list[str] = field(default_factory=list)  # hours a failed gate holds, not published
    past_retention: list[str] = field(default_factory=list)  # hours past retention, nothing loaded: reported

    def describe(self) -> str:
        parts = ", ".join(f"{t}: +{self.inserted.get(t, 0)} of {self.staged.get(t, 0)} staged" for t in T.TABLES)
        if T.REVISIONS in self.inserted:
            parts += f"; {T.REVISIONS}: +{self.inserted[T.REVISIONS]}"
        extra = f"; late corrections {self.corrections}" if self.corrections else ""
        if self.held:
            extra += f"; held by a failed gate (not published): {', '.join(sorted(set(self.held)))}"
        if self.past_retention:
            extra += (f"; past Kafka's retention, nothing of them ever loaded (reported, not checked, not held): "
                      f"{', '.join(self.past_retention)}")
        hours = ", ".join(self.hours) or "none"
        return f"run {self.run_id}: hours {hours} audited and published in {self.seconds:.1f}s ({parts}){extra}"


def write_manifest(settings: Settings, run_id: int, step: str, body: dict) -> Path:
    return write_json(settings.home / "load" / "runs" / f"{run_id:06d}-{step}.json", body)
