"""The budget service's unit tests share a consumed record's stand-in and
a budget database on SQLite."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from adpipe.budget import db, schema
from adpipe.settings import load_settings


@dataclass
class FakeMessage:
    """A record as the consumer hands it over (partition, offset, value)."""

    _partition: int
    _offset: int
    _value: bytes | None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value


@pytest.fixture
def sqlite_budget(tmp_path: Path):  # noqa: ANN201
    settings = load_settings(
        {
            "ADPIPE_HOME": str(tmp_path),
            "ADPIPE_BUDGET_DEFAULT_CPM": "2.00",
            "ADPIPE_BUDGET_DEFAULT_CPC": "0.50",
            "ADPIPE_BUDGET_DEFAULT_BUDGET": "10.00",
        }
    )
    engine = db.make_engine(settings)
    schema.ensure_schema(engine, settings)
    yield settings, engine
    engine.dispose()
