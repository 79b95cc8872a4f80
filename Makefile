# Two commands do everything on a fresh machine:
#   make run    set up .venv, fetch the default model, open the app
#   make test   the same set-up, then lint, types, import contracts, line budget and the
#               whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run chat test lint model system-libs test-libs clean

# The [server] extra is llama-cpp-python's OpenAI-compatible server, which the remote
# engine's tests run on loopback, built from source: 462 s of CPU, so ~4-5 minutes on two
# idle cores (29 minutes measured on the 2-core machine under a load average of 6-9),
# GGML_NATIVE=off, since a native build may emit instructions this VM advertises but
# refuses, plus the x86 extensions /proc/cpuinfo lists (never AMX; the machines differ).
LLAMA_CPU_FLAGS := $(shell for f in avx:AVX avx2:AVX2 fma:FMA f16c:F16C avx512f:AVX512 \
	avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do grep -qw $${f%%:*} /proc/cpuinfo \
	2>/dev/null && printf -- '-DGGML_%s=on ' $${f##*:}; done)

$(STAMP): pyproject.toml setup.py $(wildcard kernels/csrc/*.c kernels/csrc/*.h)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	CMAKE_ARGS="-DGGML_NATIVE=off $(LLAMA_CPU_FLAGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(PY) -m pip install --quiet -e '.[test,dev,server]'
	touch $(STAMP)

model: $(STAMP)
	$(PY) -m engine fetch
	$(PY) -m engine fetch gemma3-270m

# Qt's X11 plugin needs system libraries a stock Debian/Ubuntu lacks: checked before Qt
# loads; as root with apt-get they are installed, otherwise the one command is printed.
system-libs: $(STAMP)
	$(PY) -m app.system_check --install

# the suite also checks the real X11 plugin's libraries, as a window would load it (a
# headless machine too: DISPLAY and the xcb platform are set for the check alone, so a
# QT_QPA_PLATFORM=offscreen in the caller's environment does not skip the install)
test-libs: $(STAMP)
	DISPLAY=$${DISPLAY:-:0} QT_QPA_PLATFORM=xcb $(PY) -m app.system_check --install

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

test: model test-libs lint
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) results
