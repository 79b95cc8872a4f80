"""The system libraries Qt's X11 (xcb) platform plugin needs, checked before Qt loads.

A stock Debian 12 / Ubuntu 22.04 lacks some of them (libxcb-cursor0, libxcb-icccm4,
libxcb-keysyms1, ...), and Qt then aborts with "reinstalling the application may fix
this", which sends people the wrong way. `ldd` of PySide6's libqxcb.so names every
library the dynamic loader cannot find; libxcb-cursor is also checked by loading it,
because Qt 6.5+ refuses the plugin without it. Nothing here imports Qt.

    python -m app.system_check [--install]

exits 0 when the window can load, else prints the one command that installs what is
missing and exits 3; with --install, as root on a system with apt-get, it runs it.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

EXIT_MISSING = 3

# soname -> the Debian/Ubuntu package that ships it (the same names on both)
DEBIAN_PACKAGES: dict[str, str] = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-glx.so.0": "libxcb-glx0",
    "libxcb-xinput.so.0": "libxcb-xinput0",
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libSM.so.6": "libsm6",
    "libICE.so.6": "libice6",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libOpenGL.so.0": "libopengl0",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0",
}
# Loaded by Qt at run time rather than linked, so ldd alone may not see it missing.
RUNTIME_LIBRARIES = ("libxcb-cursor.so.0",)


@dataclass(frozen=True)
class MissingLibraries:
    sonames: tuple[str, ...]  # what the loader cannot find
    packages: tuple[str, ...]  # the Debian/Ubuntu packages that provide them (known ones)

    def message(self, *, has_apt: bool) -> str:
        lines = [
            "branchchat: the window cannot open: Qt's X11 (xcb) plugin needs system "
            "libraries that are missing:",
            "  " + " ".join(self.sonames),
        ]
        if self.packages and has_apt:
            lines += ["Install them with:", "  " + install_command(self)]
        elif self.packages:
            lines += ["On Debian/Ubuntu the packages are: " + " ".join(self.packages)]
        unknown = [s for s in self.sonames if s not in DEBIAN_PACKAGES]
        if unknown:
            names = ", ".join(unknown)
            lines.append(f"Find the package for {names} with your package manager.")
        lines.append("(Or chat in the terminal: python -m engine chat)")
        return "\n".join(lines)


def install_command(missing: MissingLibraries) -> str:
    return "sudo apt-get install -y " + " ".join(missing.packages)


def xcb_plugin() -> Path | None:
    """PySide6's libqxcb.so, found without importing Qt (which is what would abort)."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        plugin = Path(root) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if plugin.exists():
            return plugin
    return None


def uses_xcb(env: Mapping[str, str]) -> bool:
    """Whether Qt will load the xcb plugin: an X display and no other platform asked for
    (a Wayland session falls back to xcb too, so it counts while DISPLAY is set)."""
    platform = env.get("QT_QPA_PLATFORM", "").split(":")[0]
    if platform and platform != "xcb":
        return False
    return bool(env.get("DISPLAY"))


def has_apt() -> bool:
    return shutil.which("apt-get") is not None


def _can_load(soname: str) -> bool:
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def _ldd(plugin: Path) -> str:
    try:
        result = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""  # no ldd (not glibc): leave the verdict to Qt
    return result.stdout


def check_xcb(
    env: Mapping[str, str] | None = None,
    ldd_output: str | None = None,
    can_load: Callable[[str], bool] = _can_load,
) -> MissingLibraries | None:
    """What the xcb plugin lacks, or None when it can load (or is not the plugin used)."""
    env = os.environ if env is None else env
    if not sys.platform.startswith("linux") or not uses_xcb(env):
        return None
    if ldd_output is None:
        plugin = xcb_plugin()
        if plugin is None:
            return None
        ldd_output = _ldd(plugin)
    missing = [s for s in RUNTIME_LIBRARIES if not can_load(s)]
    for line in ldd_output.splitlines():
        name, _, where = line.strip().partition(" => ")
        if where.strip() == "not found" and name not in missing:
            missing.append(name)
    if not missing:
        return None
    missing.sort()
    packages = tuple(dict.fromkeys(DEBIAN_PACKAGES[s] for s in missing if s in DEBIAN_PACKAGES))
    return MissingLibraries(tuple(missing), packages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.system_check", description=__doc__)
    parser.add_argument(
        "--install", action="store_true", help="as root with apt-get: install what is missing"
    )
    args = parser.parse_args(argv)
    missing = check_xcb()
    if missing is None:
        return 0
    apt = has_apt()
    if args.install and apt and missing.packages and os.geteuid() == 0:
        print("branchchat: installing " + " ".join(missing.packages), file=sys.stderr)
        install = ["apt-get", "install", "-y", *missing.packages]
        if subprocess.run(install, check=False).returncode != 0:
            # a fresh image has no package lists yet
            subprocess.run(["apt-get", "update"], check=False)
            subprocess.run(install, check=False)
        missing = check_xcb()
        if missing is None:
            return 0
    print(missing.message(has_apt=apt), file=sys.stderr)
    return EXIT_MISSING


if __name__ == "__main__":
    sys.exit(main())
