"""The check `make run` and `python -m app` make before Qt loads: Qt's xcb plugin needs
system libraries a stock Debian/Ubuntu lacks, and Qt's own message misleads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app import system_check
from app.system_check import MissingLibraries, check_xcb, install_command

ROOT = Path(__file__).resolve().parents[2]

LDD_MISSING = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)
"""


def test_missing_libraries_name_the_one_apt_command():
    missing = check_xcb(
        env={"DISPLAY": ":0"},
        ldd_output=LDD_MISSING,
        can_load=lambda soname: soname != "libxcb-cursor.so.0",
    )
    assert missing == MissingLibraries(
        sonames=("libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"),
        packages=("libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1"),
    )
    assert install_command(missing) == (
        "sudo apt-get install -y libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1"
    )
    message = missing.message(has_apt=True)
    assert "sudo apt-get install -y libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1" in message
    assert "libxcb-cursor.so.0" in message


def test_nothing_missing_or_no_xcb_means_no_complaint():
    everything = lambda _soname: True  # noqa: E731
    ldd_ok = "\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"
    assert check_xcb(env={"DISPLAY": ":0"}, ldd_output=ldd_ok, can_load=everything) is None
    # offscreen / wayland / no display: the xcb plugin is not the one Qt loads
    for env in ({"QT_QPA_PLATFORM": "offscreen", "DISPLAY": ":0"}, {}, {"QT_QPA_PLATFORM": "vnc"}):
        assert check_xcb(env=env, ldd_output=LDD_MISSING, can_load=lambda _s: False) is None


def test_an_unknown_library_is_named_by_its_soname():
    ldd = "\tlibxcb-frobnicate.so.7 => not found\n"
    missing = check_xcb(env={"DISPLAY": ":0"}, ldd_output=ldd, can_load=lambda _s: True)
    assert missing is not None
    assert missing.sonames == ("libxcb-frobnicate.so.7",) and missing.packages == ()
    assert "libxcb-frobnicate.so.7" in missing.message(has_apt=True)


def test_the_real_plugin_on_this_machine_loads(monkeypatch):
    """The libraries this machine installed (the README's list) satisfy the real
    plugin: ldd of PySide6's libqxcb.so finds everything."""
    if not sys.platform.startswith("linux"):
        return
    assert system_check.xcb_plugin() is not None
    assert check_xcb(env={"DISPLAY": ":0"}) is None


def test_the_command_line_exits_non_zero_with_the_command(monkeypatch, capsys):
    missing = MissingLibraries(("libxcb-icccm.so.4",), ("libxcb-icccm4",))
    monkeypatch.setattr(system_check, "check_xcb", lambda **_kw: missing)
    monkeypatch.setattr(system_check, "has_apt", lambda: True)
    monkeypatch.setattr(system_check.os, "geteuid", lambda: 1000)
    assert system_check.main([]) == 3
    err = capsys.readouterr().err
    assert "sudo apt-get install -y libxcb-icccm4" in err


def test_as_root_with_install_it_runs_apt_get(monkeypatch):
    calls = []
    states = [MissingLibraries(("libxcb-icccm.so.4",), ("libxcb-icccm4",)), None]
    monkeypatch.setattr(system_check, "check_xcb", lambda **_kw: states.pop(0))
    monkeypatch.setattr(system_check, "has_apt", lambda: True)
    monkeypatch.setattr(system_check.os, "geteuid", lambda: 0)

    def run(cmd, **_kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(system_check.subprocess, "run", run)
    assert system_check.main(["--install"]) == 0
    assert calls[-1] == ["apt-get", "install", "-y", "libxcb-icccm4"]


def test_python_m_app_stops_before_qt_with_the_command():
    """The entry point runs the check before Qt: a missing library gives the apt-get
    line and exit status 3, not Qt's abort."""
    code = (
        "import sys, app.system_check as sc, app.__main__ as entry\n"
        "missing = sc.MissingLibraries(('libxcb-cursor.so.0',), ('libxcb-cursor0',))\n"
        "sc.check_xcb = lambda **kw: missing\n"
        "sc.has_apt = lambda: True\n"
        "rc = entry.main([])\n"
        "assert 'PySide6.QtWidgets' not in sys.modules\n"
        "sys.exit(rc)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "DISPLAY": ":99"}
    if "PYTHONPATH" in os.environ:  # a machine that puts the packages there (the GPU machine's)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3, result.stderr
    assert "sudo apt-get install -y libxcb-cursor0" in result.stderr
