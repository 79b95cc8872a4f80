# Two commands do everything on a fresh machine:
#   make run    set up .venv, fetch the default model, open the app
#   make test   the same set-up, then lint, types, import contracts, line budget and the
#               whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run chat test lint model system-libs clean

$(STAMP): pyproject.toml setup.py $(wildcard kernels/csrc/*.c kernels/csrc/*.h)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

model: $(STAMP)
	$(PY) -m engine fetch
	$(PY) -m engine fetch gemma3-270m

# Qt's X11 plugin needs system libraries a stock Debian/Ubuntu lacks: checked before Qt
# loads; as root with apt-get they are installed, otherwise the one command is printed.
system-libs: $(STAMP)
	$(PY) -m app.system_check --install

run: model system-libs
	$(PY) -m app

chat: model
	$(PY) -m engine chat

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy engine kernels
	$(VENV)/bin/lint-imports
	$(PY) tools/check_import_cycles.py engine kernels
	$(PY) tools/check_line_budget.py

test: model lint
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) results
