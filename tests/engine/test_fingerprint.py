"""The prompt cache's key: a digest of the whole weight files (remembered by path, size,
mtime and ctime) and the compute path. Two checkpoints that differ in one byte deep in a
tensor get different keys and never share a saved state; the digest is not recomputed
for an unchanged file; backend and dtype are in the key."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine import fingerprint as fp
from engine.config import EngineConfig
from engine.loader import load_model
from engine.prompt_cache import PromptCache
from engine.sequence import prefill
from tests.engine.engine_runner import (
    USERS,
    Runner,
    assert_same_reply,
    assistant,
    fresh_finished,
    greedy,
    prompt_ids,
    user,
)
from tests.engine.state_reference import assert_next_logits_exact, rows
from tests.tiny_models import make_llama_gguf

MIB = 1 << 20


@pytest.fixture(scope="module")
def twin_ggufs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A GGUF over 1 MiB and a copy with one weight's sign flipped in its last tensor, past
    the first MiB (where the old fingerprint stopped reading): a "fine-tune" of the first."""
    root = tmp_path_factory.mktemp("twins")
    base, tuned = root / "base.gguf", root / "tuned.gguf"
    make_llama_gguf(base, qtype="F32", intermediate_size=2048)
    reader = gguf.GGUFReader(str(base))
    last = max(reader.tensors, key=lambda t: t.data_offset)
    offset = last.data_offset + (last.n_bytes // 8) * 4 + 3  # a float32's sign byte
    assert base.stat().st_size > 2 * MIB and offset > MIB
    data = bytearray(base.read_bytes())
    data[offset] ^= 0x80
    tuned.write_bytes(bytes(data))
    return base, tuned


def test_one_byte_past_the_first_mib_changes_the_fingerprint(
    twin_ggufs: tuple[Path, Path],
) -> None:
    base, tuned = (load_model(p, EngineConfig(backend="numpy")) for p in twin_ggufs)
    assert base.config == tuned.config and base.compute_path == tuned.compute_path
    assert base.fingerprint != tuned.fingerprint
    ids = prompt_ids((user(USERS[1]),))
    logits = [
        rows(m.model.forward(ids, m.model.new_state(), logits="last"))[-1] for m in (base, tuned)
    ]
    assert (
        float(np.abs(logits[0] - logits[1]).max()) > 1e-3
    )  # a state of one is wrong for the other


def test_a_twin_refuses_the_saved_state_and_prefills_afresh(
    twin_ggufs: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base, tuned = twin_ggufs
    messages: tuple = (user(USERS[0]),)
    with Runner(cache_dir=tmp_path) as runner:
        runner.load(base)
        messages += (assistant(runner.generate(messages, conversation_id="c1").text),)
        session = runner.engine.session
        assert session is not None and session.prompt_cache is not None
        base_file = session.prompt_cache.path_for("c1")
    assert base_file.is_file()
    messages += (user(USERS[1]),)
    with Runner(cache_dir=tmp_path) as runner:
        runner.load(tuned)
        session = runner.engine.session
        assert session is not None and session.prompt_cache is not None
        target = session.prompt_cache.path_for("c1")
        assert target.parent != base_file.parent  # each model its own folder
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(base_file, target)  # even where the file is found, it is refused
        with caplog.at_level(logging.WARNING, logger="engine.prompt_cache"):
            finished = runner.generate(messages, conversation_id="c1")
    assert any("another model" in r.getMessage() for r in caplog.records)
    assert finished.stats is not None and finished.stats.reused_tokens == 0
    assert_same_reply(finished, fresh_finished(tuned, messages, greedy()))
    # what the tuned engine computed and saved on close is its own prefill's numbers
    loaded = load_model(tuned, EngineConfig(backend="numpy"))
    state = PromptCache(tmp_path, loaded.fingerprint).load("c1", loaded.runner)
    assert state is not None and state.offset >= len(prompt_ids(messages))
    assert_next_logits_exact(loaded.model, state)


def test_the_digest_is_remembered_until_the_file_changes(
    twin_ggufs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "model.gguf"
    shutil.copy(twin_ggufs[0], base)
    hashed: list[Path] = []
    hash_file = fp.hash_file

    def counting(file: Path) -> str:
        hashed.append(file)
        return hash_file(file)

    monkeypatch.setattr(fp, "hash_file", counting)
    config = EngineConfig(backend="numpy", prompt_cache_dir=str(tmp_path / "cache"))
    first = load_model(base, config).fingerprint  # load_model hashes while it reports progress
    assert hashed == [base.resolve()]
    assert (tmp_path / "cache" / fp.DIGEST_CACHE_NAME).is_file()
    assert load_model(base, config).fingerprint == first  # a new process: read from the file
    assert len(hashed) == 1

    st = base.stat()
    os.utime(base, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touch
    assert load_model(base, config).fingerprint == first  # same bytes, hashed again
    assert len(hashed) == 2

    shutil.copy(twin_ggufs[1], base)  # another model in its place (same size)
    assert base.stat().st_size == twin_ggufs[0].stat().st_size
    assert load_model(base, config).fingerprint != first
    assert len(hashed) == 3


def test_a_corrupt_digest_cache_is_rebuilt(twin_ggufs: tuple[Path, Path], tmp_path: Path) -> None:
    cache_file = tmp_path / fp.DIGEST_CACHE_NAME
    cache_file.write_text("{not json")
    digest = fp.DigestCache(cache_file).digest(twin_ggufs[0])
    assert digest == fp.hash_file(twin_ggufs[0])
    assert fp.DigestCache(cache_file).digest(twin_ggufs[0]) == digest  # rewritten, readable


def test_an_hf_directory_digest_covers_every_shard_and_the_config(
    tiny_models, tmp_path: Path
) -> None:
    source = tiny_models.hf("llama", shards=2)[0]
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    key = load_model(copy, EngineConfig(backend="numpy")).fingerprint
    assert key == load_model(source, EngineConfig(backend="numpy")).fingerprint
    for name in sorted(p.name for p in copy.glob("*.safetensors")):
        shard = copy / name
        data = bytearray(shard.read_bytes())
        data[-2] ^= 0x01  # the last bytes of the shard's last tensor
        shard.write_bytes(bytes(data))
        changed = load_model(copy, EngineConfig(backend="numpy")).fingerprint
        assert changed != key
        key = changed


def test_backend_and_dtype_are_in_the_key(twin_ggufs: tuple[Path, Path], tmp_path: Path) -> None:
    path = twin_ggufs[0]
    configs = {
        "numpy": EngineConfig(backend="numpy"),
        "numpy per-op": EngineConfig(backend="numpy", cpu_step=False),  # not the C step
        "mlx float32": EngineConfig(backend="mlx", dtype="float32"),
        "mlx bfloat16": EngineConfig(backend="mlx", dtype="bfloat16"),
    }
    loaded = {name: load_model(path, config) for name, config in configs.items()}
    assert len({m.fingerprint for m in loaded.values()}) == 4  # each path its own numbers
    assert loaded["numpy"].compute_path.startswith("numpy/float32/")
    assert loaded["mlx bfloat16"].compute_path.startswith("mlx/bfloat16/")
    # a float32 state saved by the NumPy session is refused by a bfloat16 one
    cpu, gpu_like = loaded["numpy"], loaded["mlx bfloat16"]
    state = cpu.runner.new_state()
    prefill(cpu.runner, state, prompt_ids((user(USERS[0]),)))
    PromptCache(tmp_path, cpu.fingerprint).save("c1", state)
    other = PromptCache(tmp_path, gpu_like.fingerprint)
    other.dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(PromptCache(tmp_path, cpu.fingerprint).path_for("c1"), other.path_for("c1"))
    assert other.load("c1", gpu_like.runner) is None
    assert not other.path_for("c1").exists()  # refused files are removed
