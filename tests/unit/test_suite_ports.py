"""The test suite's own ports stay out of the kernel's ephemeral range,
where an outgoing connection may hold one ("Address already in use")."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ephemeral_overlap


def test_a_port_base_in_the_ephemeral_range_is_refused_with_the_range_named(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert ephemeral_overlap(19092, range_file=ranges) is None
    assert ephemeral_overlap(32468, range_file=ranges) is None  # its last port is 32767
    why = ephemeral_overlap(53000, range_file=ranges)
    assert why is not None and "53000-53299" in why and "32768-60999" in why
    assert ephemeral_overlap(32469, range_file=ranges) is not None  # one port inside
    assert ephemeral_overlap(53000, range_file=tmp_path / "missing") is None  # not Linux: not checked
