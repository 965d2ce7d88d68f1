"""The load's own errors, raised by its parts (merge, ledger) and the load."""

from __future__ import annotations


class LoadError(RuntimeError):
    """The hour cannot be loaded (not closed yet, or a table write failed for good)."""


class HourNotHeld(LoadError):
    """An action for held hours (``--held-only``) asked for an hour that no
    failed gate holds: nothing was changed."""
