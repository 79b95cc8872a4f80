"""`python -m app` without a display, and the screenshot mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from app.__main__ import missing_display_message

ROOT = Path(__file__).resolve().parents[2]


def env_without_display() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        env.pop(name, None)
    return env


def test_no_display_prints_what_to_do_and_exits_2():
    if not sys.platform.startswith("linux"):
        assert missing_display_message(env_without_display()) is None
        return
    result = subprocess.run(
        [sys.executable, "-m", "app"], cwd=ROOT, env=env_without_display(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    for hint in ("QT_QPA_PLATFORM=offscreen", "xvfb-run", "python -m engine chat"):
        assert hint in result.stderr
    assert missing_display_message({"DISPLAY": ":0"}, "linux") is None
    assert missing_display_message({"QT_QPA_PLATFORM": "offscreen"}, "linux") is None
    assert missing_display_message({}, "darwin") is None


def test_screenshot_mode_renders_the_demo_without_a_model(tmp_path):
    out = tmp_path / "shot.png"
    result = subprocess.run(
        [sys.executable, "-m", "app", "--screenshot", str(out)], cwd=ROOT,
        env=env_without_display(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    image = QImage(str(out))
    assert (image.width(), image.height()) == (1200, 800)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs the no-display exit")
def test_the_entry_point_configures_the_process_before_numpy_loads():
    """`python -m app` builds the engine config once and applies its process-wide part
    (OpenBLAS's short spin) before anything loads NumPy; importing `app` loads none."""
    code = (
        "import os, sys\n"
        "import app.__main__ as entry\n"
        "assert 'numpy' not in sys.modules, 'importing the app loaded NumPy'\n"
        "assert entry.main([]) == 2\n"  # no display: it stops there, configured
        "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    )
    env = env_without_display()
    env.pop("OPENBLAS_THREAD_TIMEOUT", None)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.stdout.split()[-1:] == ["4"], result.stderr
    env["BRANCHCHAT_BACKEND"] = "tpu"
    result = subprocess.run(
        [sys.executable, "-m", "app"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "BRANCHCHAT_BACKEND" in result.stderr
