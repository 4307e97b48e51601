"""pytest-xdist's `--dist loadgroup` on pytest 9.2: the groups reach the scheduler again.

pytest-xdist (3.8) tells its scheduler a test's group by appending `@<group>` to the nodeid
the worker reports, writing the item's `_nodeid`; pytest 9.2 keeps the nodeid in a
structured `_id` instead, so that write is lost and every test becomes its own unit: a
module's tests spread over both workers (its module fixtures, a runner and a real engine,
start on each) and the real-engine tests run two at a time (pytest-xdist issue #1386). Until
pytest-xdist writes the structured id itself, `Suffixes` does, after its hook.
"""

from __future__ import annotations

import pytest
from _pytest.nodeid import NodeId


def group_of(item: pytest.Item) -> str | None:
    """The item's `xdist_group` names joined as pytest-xdist joins them, or None."""
    names = {
        str(m.args[0] if m.args else m.kwargs.get("name", "default"))
        for m in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) if names else None


class Suffixes:
    """A plugin (tests/conftest.py registers it) whose hook runs after pytest-xdist's and
    the conftest's, which gives the groups."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """In a pytest-xdist worker of `--dist loadgroup`: give each grouped item the nodeid
        `<nodeid>@<group>` that pytest-xdist's scheduler splits on, where pytest-xdist's own
        hook did not (an item that has it already is left as it is)."""
        if not getattr(config.option, "loadgroup", False):  # set in its workers only
            return
        for item in items:
            group = group_of(item)
            if group is not None and not item.nodeid.endswith(f"@{group}"):
                item._id = NodeId.parse(f"{item.nodeid}@{group}")
