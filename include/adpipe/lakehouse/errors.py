"""The load's own error, raised by its parts (merge, ledger) and the load."""

from __future__ import annotations


class LoadError(RuntimeError):
    """The hour cannot be loaded (not closed yet, or a table write failed for good)."""
