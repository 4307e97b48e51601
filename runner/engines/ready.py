"""The engines ready to serve, by model: the one map every request path reads.

The pool files an engine here once it serves and withdraws it when it stops, sleeps or
dies. A request path sees the engines of its own kind only, through its typed view
(`chat`, `speech`, `images`: the engine's facet for that path, `adapters/launched.Launched`),
the token budgets the prompt counters of those that have one (`tokens`);
a cache flush sees those that can be flushed (`flushes`); the adapters' book those that
serve LoRA adapters (`adapters`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Generic, TypeVar

from adapters.base import AdapterHost, ChatEngine, FlushResult, FlushScope
from adapters.images import ImagesEngine
from adapters.launched import Launched
from adapters.prompt_tokens import PromptCounter
from adapters.speech import SpeechEngine

E = TypeVar("E")
Flush = Callable[[FlushScope], Awaitable[FlushResult]]


class Facet(Mapping[str, E], Generic[E]):
    """The ready engines that have one facet (`facet(launched)` not None), read live."""

    def __init__(self, ready: dict[str, Launched], facet: Callable[[Launched], E | None]):
        self._ready = ready
        self._facet = facet

    def __getitem__(self, model: str) -> E:
        launched = self._ready.get(model)
        found = self._facet(launched) if launched is not None else None
        if found is None:
            raise KeyError(model)
        return found

    def get(self, model: str, default: None = None) -> E | None:  # type: ignore[override]
        """The request paths' one lookup, per request: no exception for a model not
        ready (Mapping's `get` would raise and catch one)."""
        launched = self._ready.get(model)
        return self._facet(launched) if launched is not None else None

    def __iter__(self) -> Iterator[str]:
        return (m for m, e in list(self._ready.items()) if self._facet(e) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ReadyEngines(Mapping[str, Launched]):
    def __init__(self) -> None:
        self._ready: dict[str, Launched] = {}
        self.chat: Facet[ChatEngine] = Facet(self._ready, lambda e: e.chat)
        self.speech: Facet[SpeechEngine] = Facet(self._ready, lambda e: e.speech)
        self.images: Facet[ImagesEngine] = Facet(self._ready, lambda e: e.images)
        self.tokens: Facet[PromptCounter] = Facet(self._ready, lambda e: e.tokens)
        self.flushes: Facet[Flush] = Facet(self._ready, lambda e: e.flush)
        self.adapters: Facet[AdapterHost] = Facet(self._ready, lambda e: e.adapters)

    def file(self, model: str, launched: Launched) -> None:
        self._ready[model] = launched

    def withdraw(self, model: str) -> None:
        """No request path routes to `model` any more."""
        self._ready.pop(model, None)

    def __getitem__(self, model: str) -> Launched:
        return self._ready[model]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._ready))

    def __len__(self) -> int:
        return len(self._ready)
