"""What a quality run says: its result (verdict, failed expectations, notes,
parameters, where its JSON and Data Docs are), the error a failed gate
raises, and the one line that names a failed expectation (suite, type,
columns, what was observed, and why the expectation exists)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Unexpected rows a failure line shows at most (and GE keeps per expectation).
EXAMPLES = 5


class QualityError(RuntimeError):
    """A quality gate failed; the message lists the failed expectations."""

    def __init__(self, message: str, result: QualityResult | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class QualityResult:
    hour: datetime  # UTC, start of the hour
    success: bool
    evaluated: int  # number of expectations evaluated
    failed: list[str]  # one line per failed expectation: suite, type, column(s), observed value
    data_docs: Path | None  # index.html of the built Data Docs
    results_path: Path  # the JSON of this run's validation results
    notes: list[str] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)  # the expectation parameters used

    def describe(self) -> str:
        verdict = "passed" if self.success else f"FAILED ({len(self.failed)} of {self.evaluated} expectations failed)"
        lines = [f"Great Expectations, hour {hour_tag(self.hour)}: {verdict}; {self.evaluated} expectations evaluated"]
        lines += [f"  FAILED {line}" for line in self.failed]
        lines += [f"  note: {note}" for note in self.notes]
        if self.parameters:
            lines.append("  parameters: " + ", ".join(f"{k}={v}" for k, v in sorted(self.parameters.items())))
        lines.append(f"  results: {self.results_path}")
        lines.append(f"  data docs: {self.data_docs or '(not built)'}")
        return "\n".join(lines)

    def raise_for_failure(self) -> None:
        """Raise :class:`QualityError` naming every failed expectation, if any."""
        if not self.success:
            raise QualityError(self.describe(), self)


def hour_tag(hour: datetime) -> str:
    """The hour as results and logs name it: ``2026-11-22T13``."""
    return hour.astimezone(UTC).strftime("%Y-%m-%dT%H")


_TARGET_KEYS = (
    "column",
    "column_list",
    "column_A",
    "column_B",
    "type_",
    "value_set",
    "value",
    "min_value",
    "max_value",
)


def _short(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_short(v)}" for k, v in value.items()) + "}"
    return repr(value) if isinstance(value, str) else str(value)


def _exception_message(info: Any) -> str | None:
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message") or "exception")
    for value in info.values():
        message = _exception_message(value)
        if message:
            return message
    return None


def _in_order(example: Any, index_columns: tuple[str, ...]) -> Any:
    """An unexpected row's columns with the index columns first, then the
    rest by name: the same line whichever engine GE ran on."""
    if not isinstance(example, dict):
        return example
    rest = sorted(k for k in example if k not in index_columns)
    return {k: example[k] for k in (*[c for c in index_columns if c in example], *rest)}


def _observed(result: dict[str, Any], index_columns: tuple[str, ...]) -> str:
    if "observed_value" in result:
        return f"observed {_short(result['observed_value'])}"
    parts = [f"{result.get('unexpected_count')} unexpected of {result.get('element_count')} rows"]
    examples = result.get("partial_unexpected_index_list") or result.get("partial_unexpected_counts") or []
    if examples:
        parts.append("e.g. " + "; ".join(_short(_in_order(e, index_columns)) for e in examples[:EXAMPLES]))
    return ", ".join(parts)


def failure_line(suite: str, evr: Any, index_columns: tuple[str, ...] = ()) -> str:
    """``suite: type(column=..., ...): observed ...`` for one failed
    expectation result; an unexpected row names ``index_columns`` first."""
    config = evr.expectation_config
    kwargs = config.kwargs
    target = ", ".join(f"{k}={_short(kwargs[k])}" for k in _TARGET_KEYS if kwargs.get(k) is not None)
    error = _exception_message(evr.exception_info)
    observed = f"error: {error}" if error else _observed(evr.result or {}, index_columns)
    notes = getattr(config, "notes", None)
    why = f" [{notes if isinstance(notes, str) else '; '.join(notes)}]" if notes else ""
    return f"{suite}: {config.type}({target}): {observed}{why}"
