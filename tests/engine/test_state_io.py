"""Saving and loading a sequence state: bit-exact round trips (live arrays, tokens and
snapshots, which truncate then uses), refusals that name the file, and atomic writes."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import IO, Any

import mlx.core as mx
import numpy as np
import pytest

from engine import state_io
from engine.errors import StateError
from engine.loader import LoadedModel
from engine.sequence import SequenceState, prefill, truncate
from engine.state_io import load_state, save_state
from tests.conftest import TinyModels
from tests.engine.state_reference import assert_next_logits_exact, probe_next_logits, token_ids
from tests.engine.test_state_property import POLICIES, StateModels
from tests.tolerances import host

KINDS = ["llama", "sliding", "hybrid"]


@pytest.fixture(scope="module")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> StateModels:
    return StateModels(tiny_models, tmp_path_factory.mktemp("io_models"))


def busy_state(loaded: LoadedModel, kind: str) -> SequenceState:
    """50 tokens with stride snapshots, two marks (one on a stride position) and a commit."""
    model = loaded.model
    state = model.new_state(POLICIES[kind])
    state.mark(21)
    state.mark(40)
    prefill(model, state, token_ids(0, 46))
    cp = state.checkpoint(record=True)
    model.forward(token_ids(1, 4), state, logits="all")
    state.commit(cp)
    return state


def snapshot_contents(state: SequenceState) -> list[tuple[str, int, list[Any]]]:
    """Every stored snapshot as host arrays, in store order."""
    out = []
    for store, pos, snaps in state.snapshot_items():
        layers = [None if s is None else [None if a is None else host(a) for a in s] for s in snaps]
        out.append((store, pos, layers))
    return out


def assert_bit_exact(a: SequenceState, b: SequenceState) -> None:
    assert a.tokens == b.tokens
    assert a.policy == b.policy
    assert [layer.length for layer in a.layers] == [layer.length for layer in b.layers]
    for la, lb in zip(a.layers, b.layers, strict=True):
        xa, xb = la.arrays(), lb.arrays()
        assert xa.keys() == xb.keys()
        for key in xa:
            assert xa[key].dtype == xb[key].dtype
            assert np.array_equal(host(xa[key]), host(xb[key])), f"live array {key!r}"
    sa, sb = snapshot_contents(a), snapshot_contents(b)
    assert [(store, pos) for store, pos, _ in sa] == [(store, pos) for store, pos, _ in sb]
    for (_, pos, layers_a), (_, _, layers_b) in zip(sa, sb, strict=True):
        for snap_a, snap_b in zip(layers_a, layers_b, strict=True):
            assert (snap_a is None) == (snap_b is None)
            for x, y in zip(snap_a or [], snap_b or [], strict=True):
                assert x.dtype == y.dtype and np.array_equal(x, y), f"snapshot at {pos}"
    assert a.snapshot_nbytes() == b.snapshot_nbytes()


@pytest.mark.parametrize(
    ("kind", "backend"),
    [(k, "numpy") for k in KINDS]
    + [("sliding", "numpy-float32"), ("hybrid", "numpy-float32")]
    + [(k, b) for b in ("mlx", "mlx-bfloat16") for k in ("sliding", "hybrid")],
)
def test_round_trip_is_bit_exact(
    models: StateModels, tmp_path: Path, kind: str, backend: str
) -> None:
    loaded = models.get(kind, backend)
    state = busy_state(loaded, kind)
    path = tmp_path / "state.safetensors"
    written = save_state(state, path, loaded.fingerprint)
    assert written == path.stat().st_size
    reloaded = load_state(loaded.model, path, loaded.fingerprint)
    assert_bit_exact(state, reloaded)
    before = probe_next_logits(loaded.model, state, 7)
    after = probe_next_logits(loaded.model, reloaded, 7)
    assert np.array_equal(before, after)
    if backend != "mlx-bfloat16":  # a fresh prefill rounds otherwise (StateModels.get)
        assert_next_logits_exact(loaded.model, reloaded)


def test_an_empty_state_round_trips(models: StateModels, tmp_path: Path) -> None:
    loaded = models.get("hybrid")
    state = loaded.model.new_state(POLICIES["hybrid"])
    save_state(state, tmp_path / "empty.safetensors", loaded.fingerprint)
    reloaded = load_state(loaded.model, tmp_path / "empty.safetensors", loaded.fingerprint)
    assert_bit_exact(state, reloaded)
    assert_next_logits_exact(loaded.model, reloaded)


@pytest.mark.parametrize("kind", ["sliding", "hybrid"])
def test_truncate_after_reload_uses_the_reloaded_snapshots(
    models: StateModels, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = models.get(kind)
    model = loaded.model
    path = tmp_path / "state.safetensors"
    save_state(busy_state(loaded, kind), path, loaded.fingerprint)
    reloaded = load_state(model, path, loaded.fingerprint)
    replayed: list[int] = []
    forward = model.forward

    def counting_forward(ids: list[int], state: SequenceState, logits: str = "last") -> Any:
        replayed.extend(ids)
        return forward(ids, state, logits)

    monkeypatch.setattr(model, "forward", counting_forward)
    for n, start in ((43, 40), (23, 21)):  # a stride snapshot, then a mark
        assert reloaded.plan_truncate(n) == start
        replayed.clear()
        truncate(model, reloaded, n)
        assert len(replayed) == n - start
    monkeypatch.undo()
    assert_next_logits_exact(model, reloaded)


def test_the_format_carries_a_state_from_numpy_to_mlx(models: StateModels, tmp_path: Path) -> None:
    """The file format converts between backends; the prompt cache never asks it to, since
    the backend is part of a session's fingerprint (tests/engine/test_fingerprint.py)."""
    numpy_model, mlx_model = models.get("hybrid", "numpy-float32"), models.get("hybrid", "mlx")
    assert numpy_model.fingerprint != mlx_model.fingerprint
    path = tmp_path / "state.safetensors"
    save_state(busy_state(numpy_model, "hybrid"), path, "one key")
    state = load_state(mlx_model.model, path, "one key")
    truncate(mlx_model.model, state, 45)
    assert_next_logits_exact(mlx_model.model, state)


@pytest.mark.parametrize(
    ("saved", "loading", "message"),
    [
        ("numpy", "numpy-float32", "K/V rows in float16; this engine keeps them in float32"),
        ("numpy-float32", "numpy", "K/V rows in float32; this engine keeps them in float16"),
        ("numpy", "mlx", "K/V rows in float16; this engine keeps them in float32"),
    ],
)
def test_a_state_with_another_kv_dtype_is_refused(
    models: StateModels, tmp_path: Path, saved: str, loading: str, message: str
) -> None:
    """Rounding float32 rows to float16, or widening float16 ones, is not the state a fresh
    prefill there computes: refused by name before any array is read (the fingerprint, which
    holds the K/V dtype, keeps the prompt cache from asking)."""
    writer, reader = models.get("sliding", saved), models.get("sliding", loading)
    assert writer.fingerprint != reader.fingerprint
    path = tmp_path / "state.safetensors"
    save_state(busy_state(writer, "sliding"), path, "one key")
    with pytest.raises(StateError, match=message) as info:
        load_state(reader.model, path, "one key")
    assert str(path) in str(info.value)


def test_a_file_from_another_model_is_refused(models: StateModels, tmp_path: Path) -> None:
    hybrid, sliding = models.get("hybrid"), models.get("sliding")
    path = tmp_path / "state.safetensors"
    save_state(busy_state(hybrid, "hybrid"), path, hybrid.fingerprint)
    with pytest.raises(StateError, match="another model") as info:
        load_state(sliding.model, path, sliding.fingerprint)
    assert str(path) in str(info.value)
    # a matching fingerprint string on a model of another shape is still caught
    with pytest.raises(StateError, match="do not match"):
        load_state(sliding.model, path, hybrid.fingerprint)


def corruptions(good: bytes) -> dict[str, bytes]:
    header_len = int.from_bytes(good[:8], "little")
    data = 8 + header_len
    flipped_data = bytearray(good)
    flipped_data[data + (len(good) - data) // 2] ^= 0x40
    return {
        "a flipped data byte": bytes(flipped_data),
        "cut in half": good[: len(good) // 2],
        "cut in the header": good[: data // 2],
        "empty": b"",
        "not safetensors": b"GGUF" + bytes(range(200)),
        "header length too large": (10**9).to_bytes(8, "little") + good[8:],
    }


@pytest.mark.parametrize(
    "case",
    [
        "a flipped data byte",
        "cut in half",
        "cut in the header",
        "empty",
        "not safetensors",
        "header length too large",
    ],
)
def test_a_corrupt_file_is_refused_naming_it(
    models: StateModels, tmp_path: Path, case: str
) -> None:
    loaded = models.get("hybrid")
    good_path = tmp_path / "good.safetensors"
    save_state(busy_state(loaded, "hybrid"), good_path, loaded.fingerprint)
    bad_path = tmp_path / "bad.safetensors"
    bad_path.write_bytes(corruptions(good_path.read_bytes())[case])
    with pytest.raises(StateError) as info:
        load_state(loaded.model, bad_path, loaded.fingerprint)
    assert str(bad_path) in str(info.value)


def test_an_edited_header_is_refused(models: StateModels, tmp_path: Path) -> None:
    """A token id changed in the JSON header is still valid JSON: the checksum catches it."""
    loaded = models.get("llama")
    path = tmp_path / "state.safetensors"
    state = loaded.model.new_state(POLICIES["llama"])
    prefill(loaded.model, state, [5, 9, 11])
    save_state(state, path, loaded.fingerprint)
    raw = path.read_bytes()
    assert raw.count(b"[5,9,11]") == 1
    path.write_bytes(raw.replace(b"[5,9,11]", b"[6,9,11]"))
    with pytest.raises(StateError, match="checksum"):
        load_state(loaded.model, path, loaded.fingerprint)


def test_a_missing_file_is_refused(models: StateModels, tmp_path: Path) -> None:
    loaded = models.get("llama")
    with pytest.raises(StateError, match="no such state file"):
        load_state(loaded.model, tmp_path / "absent.safetensors", loaded.fingerprint)


def test_a_failed_write_keeps_the_previous_file(
    models: StateModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = models.get("hybrid")
    path = tmp_path / "state.safetensors"
    state = busy_state(loaded, "hybrid")
    save_state(state, path, loaded.fingerprint)
    previous = path.read_bytes()
    prefill(loaded.model, state, token_ids(5, 10))
    write = state_io._write_safetensors

    def disk_fills_up(f: IO[bytes], tensors: dict[str, Any], metadata: dict[str, str]) -> None:
        write(f, tensors, metadata)  # a half-written temporary file, then the error
        f.truncate(100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(state_io, "_write_safetensors", disk_fills_up)
    with pytest.raises(StateError, match="No space left on device") as info:
        save_state(state, path, loaded.fingerprint)
    assert str(path) in str(info.value)
    assert path.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary left

    def crash_on_replace(src: Any, dst: Any) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.undo()
    monkeypatch.setattr(state_io.os, "replace", crash_on_replace)
    with pytest.raises(StateError, match="Input/output error"):
        save_state(state, path, loaded.fingerprint)
    monkeypatch.undo()
    assert path.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    assert load_state(loaded.model, path, loaded.fingerprint).offset == 50


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_the_writer_reports_a_full_disk() -> None:
    """Why the writer goes through a file object: MLX's path form ignores write errors."""
    with open("/dev/full", "wb", buffering=0) as f, pytest.raises(OSError) as info:
        state_io._write_safetensors(f, {"a": mx.zeros((1024, 1024))}, {"k": "v"})
    assert info.value.errno == errno.ENOSPC


def test_an_unusable_state_is_not_saved(models: StateModels, tmp_path: Path) -> None:
    loaded = models.get("hybrid")
    state = busy_state(loaded, "hybrid")
    path = tmp_path / "state.safetensors"
    cp = state.checkpoint(record=True)
    loaded.model.forward(token_ids(3, 3), state, logits="all")
    with pytest.raises(StateError, match="verify is open"):
        save_state(state, path, loaded.fingerprint)
    state.rollback_retaining(cp, 1)
    state.is_poisoned = True  # as a forward that raised half-way leaves it
    with pytest.raises(StateError, match="failed forward"):
        save_state(state, path, loaded.fingerprint)
    assert not path.exists()
