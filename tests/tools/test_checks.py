"""The checks `make lint` runs beside ruff and mypy: each flags what it should and only that."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import check_import_cycles, check_line_budget


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_line_budget_names_each_long_file_with_its_count(tmp_path, capsys):
    _write(tmp_path / "pkg" / "long.py", "x = 1\n" * 401)
    _write(tmp_path / "pkg" / "fits.py", "x = 1\n" * 400)
    _write(tmp_path / ".venv" / "lib" / "huge.py", "x = 1\n" * 5000)
    _write(tmp_path / "build" / "lib" / "huge.py", "x = 1\n" * 5000)
    _write(tmp_path / "notes.txt", "x\n" * 5000)
    assert check_line_budget.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "pkg/long.py: 401 lines" in out
    assert "fits.py" not in out and "huge.py" not in out


def test_line_budget_passes_when_every_file_fits(tmp_path):
    _write(tmp_path / "a.py", "x = 1\n" * 10)
    assert check_line_budget.main(["--budget", "10", str(tmp_path)]) == 0


@pytest.fixture
def cyclic_package(tmp_path, monkeypatch):
    """pkgcyc: a -> b -> sub.c -> a (the middle one a lazy import), d and e acyclic."""
    root = tmp_path / "pkgcyc"
    _write(root / "__init__.py", "")
    _write(root / "a.py", "from pkgcyc import b\n")
    _write(root / "b.py", "def later():\n    from pkgcyc.sub import c\n")
    _write(root / "sub" / "__init__.py", "")
    _write(root / "sub" / "c.py", "import pkgcyc.a\n")
    _write(root / "d.py", "")
    _write(root / "e.py", "import pkgcyc.d\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return root


def test_import_cycles_are_found_through_lazy_imports(cyclic_package, capsys):
    assert check_import_cycles.import_cycles(["pkgcyc"]) == [
        ["pkgcyc.a", "pkgcyc.b", "pkgcyc.sub.c", "pkgcyc.a"]
    ]
    assert check_import_cycles.main(["pkgcyc"]) == 1
    assert "pkgcyc.a -> pkgcyc.b -> pkgcyc.sub.c -> pkgcyc.a" in capsys.readouterr().out


def test_an_acyclic_package_passes(cyclic_package):
    (cyclic_package / "sub" / "c.py").write_text("import pkgcyc.d\n")
    assert check_import_cycles.main(["pkgcyc"]) == 0
