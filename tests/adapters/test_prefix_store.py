"""adapters.llama_server.prefix_store: saved prompt states on disk, their index, bounds,
permissions and sweeps (files written here stand in for llama-server's; the real engine:
tests/runner/engines/test_prefixes_real.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from adapters.llama_server.prefix_store import (
    Bounds,
    PrefixCache,
    PrefixStore,
    folder_key,
    sweep,
)
from adapters.llama_server.slots import SavedView

pytestmark = pytest.mark.timeout(10)

BOUNDS = Bounds(max_bytes=1000, max_entries=3, ttl_s=100.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _save(store: PrefixStore, tenant: str, size: int = 100, **kw: object) -> str:
    """What the engine does: write the state file, then hand the view to the store."""
    key = store.new_key(public=bool(kw.get("public")))
    (store.folder / key).write_bytes(b"k" * size)
    store.add(
        SavedView(
            key,
            tenant,
            kw.get("tag"),
            f"prompt of {tenant}",
            store.clock(),
            **{k: v for k, v in kw.items() if k != "tag"},
        )
    )  # type: ignore[arg-type]
    return key


def test_store_files_are_the_runners_only_and_read_back_on_open(tmp_path: Path) -> None:
    """The folder is 0700 and each state and description 0600; a store opened again (a
    reload, a restart) finds every entry with its tenant, tag, adapter and prompt start."""
    clock = Clock()
    store = PrefixStore(tmp_path / "m", BOUNDS, clock=clock)
    store.open()
    key = _save(store, "a", tag="t", adapter="x@1")
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "m").iterdir()} == {0o600}
    again = PrefixStore(tmp_path / "m", BOUNDS, clock=clock)
    again.open()
    (view,) = again.entries
    assert (view.key, view.tenant, view.tag, view.adapter) == (key, "a", "t", "x@1")
    assert view.prefix == "prompt of a" and view.size == 100


def test_store_keeps_within_bytes_and_entries_least_recently_used_out(tmp_path: Path) -> None:
    """Past `max_entries` or `max_bytes` the least recently used entries go (a restore
    counts as a use), files and descriptions both."""
    clock = Clock()
    store = PrefixStore(tmp_path, BOUNDS, clock=clock)
    store.open()
    keys = []
    for tenant in "abc":
        keys.append(_save(store, tenant))
        clock.now += 1
    store.touch(keys[0])  # a restored: now the most recently used
    clock.now += 1
    _save(store, "d")
    assert {v.tenant for v in store.entries} == {"a", "c", "d"}
    assert not (tmp_path / keys[1]).exists()
    assert not (tmp_path / keys[1].replace(".bin", ".json")).exists()
    _save(store, "e", size=900)  # 1300 bytes: the oldest go until within 1000
    assert store.bytes_used <= 1000 and "e" in {v.tenant for v in store.entries}


def test_store_expires_entries_unused_for_the_ttl(tmp_path: Path) -> None:
    """An entry unused for `ttl_s` is removed, at the next save and when opened again."""
    clock = Clock()
    store = PrefixStore(tmp_path, BOUNDS, clock=clock)
    store.open()
    _save(store, "a")
    clock.now += 101
    _save(store, "b")
    assert [v.tenant for v in store.entries] == ["b"]
    clock.now += 101
    store.open()
    assert store.entries == []


def test_store_drops_incomplete_and_unreadable_entries_on_open(tmp_path: Path) -> None:
    """A state without its description, a description without its state, an unreadable
    description and a half-written one are removed when the store opens."""
    (tmp_path / "q-1.bin").write_bytes(b"x")  # no .json
    (tmp_path / "q-2.json").write_text("{}")  # no .bin
    (tmp_path / "q-3.bin").write_bytes(b"x")
    (tmp_path / "q-3.json").write_text("not json")
    (tmp_path / "q-4.tmp").write_text("{")
    store = PrefixStore(tmp_path, BOUNDS, clock=Clock())
    store.open()
    assert store.entries == [] and list(tmp_path.iterdir()) == []


def test_store_remove_where_and_a_private_folder_goes_with_its_engine(tmp_path: Path) -> None:
    """`remove_where` removes what it matches; a non-persistent store's folder is removed
    on close, a persistent one's kept."""
    store = PrefixStore(tmp_path / "p", BOUNDS, persistent=False, clock=Clock())
    store.open()
    _save(store, "a")
    _save(store, "b")
    assert store.remove_where(lambda v: v.tenant == "a") == 1
    assert [v.tenant for v in store.entries] == ["b"]
    store.close()
    assert not (tmp_path / "p").exists()
    kept = PrefixStore(tmp_path / "k", BOUNDS, clock=Clock())
    kept.open()
    kept.close()
    assert (tmp_path / "k").is_dir()


def test_sweep_reaches_folders_not_held_and_removes_empty_ones(tmp_path: Path) -> None:
    """A sweep removes the matching entries of every model folder but those held open by a
    running engine, and folders left empty."""
    clock = Clock()
    held, other, empty = (PrefixStore(tmp_path / n, BOUNDS, clock=clock) for n in "hoe")
    for store in (held, other, empty):
        store.open()
    _save(held, "a")
    _save(other, "a")
    _save(other, "b")
    assert sweep(tmp_path, BOUNDS, lambda v: v.tenant == "a", [tmp_path / "h"], clock) == 1
    left = {
        p.name: sorted(json.loads(m.read_text())["tenant"] for m in p.glob("*.json"))
        for p in tmp_path.iterdir()
    }
    assert left == {"h": ["a"], "o": ["b"]}


def test_folder_key_changes_with_model_build_and_flags() -> None:
    """A different model file, engine build or cache flag is a different folder."""
    base = folder_key("m" * 64, "b" * 64, ["--swa-full"])
    assert len(base) == 32
    assert base != folder_key("n" * 64, "b" * 64, ["--swa-full"])
    assert base != folder_key("m" * 64, "c" * 64, ["--swa-full"])
    assert base != folder_key("m" * 64, "b" * 64, [])


def test_prefix_cache_hashes_a_file_once_per_version(tmp_path: Path) -> None:
    """The model file's digest is computed once and kept (0600) beside the folders; a
    changed file is hashed again."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"one")
    cache = PrefixCache(tmp_path / "root", BOUNDS)
    first = cache.digest(model)
    again = PrefixCache(tmp_path / "root", BOUNDS)
    assert again.digest(model) == first
    assert stat.S_IMODE((tmp_path / "root" / "digests.json").stat().st_mode) == 0o600
    model.write_bytes(b"two, longer")
    os.utime(model, (1, 1))
    assert again.digest(model) != first


def test_unusable_root_falls_back_to_a_private_folder(tmp_path: Path) -> None:
    """A PREFIX_CACHE_DIR that cannot be written does not stop the engine: it gets a
    private folder, removed with it."""
    root = tmp_path / "root"
    root.write_text("a file, not a folder")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"m")
    store = PrefixCache(root, BOUNDS).store_for(model, model, [], tmp_path / "scratch")
    assert not store.persistent and store.folder == tmp_path / "scratch" / "slots"
