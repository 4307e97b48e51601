"""`faults.record`: the hot path's records are immutable to the type checker, and equal,
hashable and slotted at run time as `@dataclass(frozen=True, slots=True)` records are."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import mypy.api
import pytest

from faults.record import record


@record
class Point:
    x: int
    y: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenPoint:
    x: int
    y: int = 0


def test_a_record_is_equal_hashable_and_slotted_as_a_frozen_dataclass() -> None:
    assert Point(1, 2) == Point(1, 2) != Point(1, 3)
    assert hash(Point(1, 2)) == hash(Point(1, 2)) == hash(FrozenPoint(1, 2))
    assert {Point(1, 2): "a"}[Point(1, 2)] == "a"
    assert not hasattr(Point(1), "__dict__")
    assert [f.name for f in dataclasses.fields(Point)] == ["x", "y"]
    assert dataclasses.replace(Point(1, 2), y=5) == Point(1, 5)
    assert repr(Point(1, 2)) == "Point(x=1, y=2)"


def test_mypy_refuses_assigning_a_records_field(tmp_path: Path) -> None:
    source = tmp_path / "assign.py"
    source.write_text(
        textwrap.dedent(
            """
            from faults.record import record

            @record
            class Point:
                x: int

            Point(1).x = 2
            """
        )
    )
    out, _err, status = mypy.api.run(["--strict", "--no-incremental", str(source)])
    assert status == 1
    assert 'Property "x" defined in "Point" is read-only' in out


@pytest.mark.parametrize("name", ["x", "y"])
def test_a_records_fields_are_not_checked_again_at_run_time(name: str) -> None:
    """What the record trades for its speed: nothing stops an assignment at run time
    (`FrozenPoint` would raise); mypy strict over every product package does."""
    point = Point(1, 2)
    setattr(point, name, 9)  # the run-time behaviour is what is pinned
    assert getattr(point, name) == 9
