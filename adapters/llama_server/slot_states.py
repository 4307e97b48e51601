"""A running llama-server's slot states: saved, restored and built, on the model's prefix
cache (`prefix_store.py`). The engine (`engine.py`) decides which slot a request takes
(`slots.choose_slot`) and keeps each slot's bookkeeping; this carries out what the choice
says to the slot's cache:

- save: `POST /slots/{id}?action=save {"filename"}` into the prefix cache, filed under the
  tenant, tag and adapter it served (the store keeps within its bounds);
- restore: `action=restore` of a saved state (it replaces the slot's whole cache); a
  tenant's own state moves into the slot (saved again when the slot is next taken), a
  public one stays saved for everyone;
- build: a public prefix computed in the slot (`/completion` of its text alone, `n_predict`
  0, with the request's adapter), then saved for everyone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import httpx

from adapters.llama_server.prefix_store import PrefixStore
from adapters.llama_server.slots import SavedView

log = logging.getLogger("quorum.llama_server")

BUILD_TIMEOUT_S = 600.0  # computing a long public prefix on a busy CPU


@dataclass(frozen=True, slots=True)
class PublicText:
    """A declared public prefix as the engine uses it: what a request's `prompt_prefix`
    starts with (`match`), and the text to compute its state from (a chat's system
    message, or a completion's prompt)."""

    name: str
    match: str
    text: str
    chat: bool


@dataclass
class SlotStates:
    """The saved states of one engine process (`store` None: none are kept)."""

    model_id: str
    control: httpx.AsyncClient
    store: PrefixStore | None
    public: tuple[PublicText, ...] = ()
    _building: set[tuple[str, str]] = field(init=False, default_factory=set)

    def candidates(self, adapter: str) -> list[SavedView]:
        """Saved states on this adapter, and the public prefixes not saved yet for it."""
        if self.store is None:
            return []
        saved = [v for v in self.store.entries if v.adapter == adapter]
        built = {v.public for v in saved if v.public}
        missing = [
            SavedView("", "", None, p.match, 0.0, adapter, p.name)
            for p in self.public
            if p.name not in built and (p.name, adapter) not in self._building
        ]
        return saved + missing

    async def save(
        self, slot_id: int, tenant: str, tag: str | None, prefix: str, adapter: str
    ) -> None:
        """Save the slot's cache under its tenant, tag and adapter (nothing without a
        store; a failure is logged)."""
        if self.store is None:
            return
        key = self.store.new_key()
        if await self.action(slot_id, "save", key):
            self.store.add(SavedView(key, tenant, tag, prefix, time.time(), adapter))

    async def restore(self, slot_id: int, key: str) -> bool:
        """Load a saved state into the slot; False when it is gone or the engine refused."""
        store = self.store
        entry = store.get(key) if store is not None else None
        if store is None or entry is None:
            return False
        ok = await self.action(slot_id, "restore", key)
        if not ok or not entry.public:
            store.remove(key)  # now live in the slot (or unusable)
        else:
            store.touch(key)
        return ok

    async def build(
        self, slot_id: int, name: str, adapter: str, lora: list[dict[str, object]] | None
    ) -> bool:
        """Compute public prefix `name` in the slot and save it for every tenant; False
        when computing it failed (the caller erases the slot)."""
        public = next(p for p in self.public if p.name == name)
        building = (name, adapter)
        self._building.add(building)
        try:
            prompt = await self.public_prompt(public)
            body: dict[str, object] = {
                "prompt": prompt,
                "n_predict": 0,
                "id_slot": slot_id,
                "cache_prompt": True,
            }
            if lora is not None:
                body["lora"] = lora
            r = await self.control.post("/completion", json=body, timeout=BUILD_TIMEOUT_S)
            r.raise_for_status()
            if self.store is not None:
                key = self.store.new_key(public=True)
                if await self.action(slot_id, "save", key):
                    view = SavedView(key, "", None, public.match, time.time(), adapter, name)
                    self.store.add(view)
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("model %s: building public prefix %s failed: %s", self.model_id, name, exc)
            return False
        finally:
            self._building.discard(building)
        return True

    async def public_prompt(self, public: PublicText) -> str:
        """The prompt text a public prefix's state is computed from: a completion's text
        as declared; a chat's system message as the engine's chat template renders it, cut
        right after the declared text (what every chat starting with it begins with)."""
        if not public.chat:
            return public.text
        messages = [
            {"role": "system", "content": public.text},
            {"role": "user", "content": "-"},
        ]
        r = await self.control.post("/apply-template", json={"messages": messages})
        r.raise_for_status()
        rendered = r.json()["prompt"]
        at = rendered.find(public.text) if isinstance(rendered, str) else -1
        if at < 0:
            raise ValueError("the chat template does not keep the system text as it is")
        return str(rendered[: at + len(public.text)])

    async def action(self, slot_id: int, action: str, key: str) -> bool:
        """`POST /slots/{id}?action=save|restore {"filename": key}`; False (logged) when it
        fails."""
        try:
            r = await self.control.post(
                f"/slots/{slot_id}", params={"action": action}, json={"filename": key}
            )
            r.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("model %s: %s of slot %d failed: %s", self.model_id, action, slot_id, exc)
            return False
        return True
