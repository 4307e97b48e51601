"""Callers waiting for a model's next load or unload outcome, settled all at once."""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

T = TypeVar("T")


class Waiters(Generic[T]):
    """Per model, the futures of everyone waiting for its next outcome."""

    def __init__(self) -> None:
        self._by_model: dict[str, list[asyncio.Future[T]]] = {}

    def add(self, model: str) -> asyncio.Future[T]:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._by_model.setdefault(model, []).append(future)
        return future

    def settle(self, model: str, outcome: T | Exception) -> None:
        """Every waiter of `model` gets `outcome` (an exception is raised to each)."""
        for future in self._by_model.pop(model, []):
            if future.done():  # its caller gave up
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
