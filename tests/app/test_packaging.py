"""What `pip install` / `pipx install` gives (issue 17): the `branchchat` window as a GUI
entry point, `branchchat-cli` for the engine, and the resources a wheel carries (the
style sheet, the icon, the .desktop launcher) where app.theme and desktops find them.
Checked from pyproject.toml, so an entry that names a missing function or file fails
here rather than after a release."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def resolve(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def test_the_entry_points_name_real_mains():
    gui = PROJECT["project"]["gui-scripts"]
    cli = PROJECT["project"]["scripts"]
    assert gui == {"branchchat": "app.__main__:main"}
    assert cli == {"branchchat-cli": "engine.__main__:main"}
    assert callable(resolve(gui["branchchat"])) and callable(resolve(cli["branchchat-cli"]))


def test_the_wheel_carries_every_resource_the_app_reads():
    data_files = PROJECT["tool"]["setuptools"]["data-files"]
    shipped = {Path(f).name for files in data_files.values() for f in files}
    on_disk = {p.name for p in (ROOT / "resources").iterdir() if p.is_file()}
    assert on_disk <= shipped, f"not in the wheel: {sorted(on_disk - shipped)}"
    for files in data_files.values():
        assert all((ROOT / f).is_file() for f in files)
    assert "resources/branchchat.desktop" in data_files["share/applications"]


def test_huggingface_hub_is_a_core_dependency():
    names = [d.split(">")[0].split("=")[0].strip() for d in PROJECT["project"]["dependencies"]]
    assert "huggingface_hub" in names
