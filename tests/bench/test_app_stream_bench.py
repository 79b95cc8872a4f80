"""`python -m bench app_stream` runs the real window over a streamed reply and writes what
it measured; its figures are the benchmark's, only their presence and counts are asserted."""

from __future__ import annotations

import json
import os

import pytest

# the window's bench needs the app's extras (PySide6 and pytest-qt's qapp); a machine that
# has only the engine's, such as the GPU rounds', skips it as it skips tests/app
pytest.importorskip("pytestqt", reason="pytest-qt (the app's test extra) is not installed")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from bench import app_stream  # noqa: E402


def test_the_bench_streams_a_reply_into_the_window_and_writes_its_figures(
    tmp_path, monkeypatch, capsys, qapp
):
    monkeypatch.chdir(tmp_path)
    argv = ["--runs", "2", "--tokens", "300", "--turns", "4", "--rate", "3000", "--json"]
    assert app_stream.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    [written] = (tmp_path / "results").glob("app_stream-*.json")
    assert json.loads(written.read_text()) == printed
    assert printed["settings"]["tokens"] == 300 and len(printed["runs"]) == 2
    for run in printed["runs"]:
        # paced over ~0.1 s, the reply reaches the view in a few pushes, not one a token
        assert 1 <= run["reply_pushes"] <= 30
        assert run["ticks"] >= 1 and run["max_gap_wall_ms"] >= run["p99_gap_wall_ms"] > 0
        assert run["gui_thread_cpu_s"] > 0 and run["send_to_last_repaint_s"] >= 0.1
    figures = printed["figures"]["max_gap_cpu_ms"]
    assert figures["min"] <= figures["median"] <= figures["max"]


def test_a_reply_the_window_does_not_show_whole_fails_the_run(tmp_path, monkeypatch, qapp):
    """The bench checks the window's last row against the streamed reply: a stand-in that
    loses a piece is caught, not timed."""
    monkeypatch.chdir(tmp_path)
    real = app_stream.ReplayEngine.__init__

    def lossy(self, listener, pieces, rate):
        real(self, listener, pieces[:-1], rate)

    monkeypatch.setattr(app_stream.ReplayEngine, "__init__", lossy)
    with pytest.raises(RuntimeError, match="not the reply streamed"):
        app_stream.main(["--runs", "1", "--tokens", "50", "--turns", "1"])
