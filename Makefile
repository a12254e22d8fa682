# nbgrad: `make lab` opens JupyterLab on a working copy of the tutorials; `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
PY := $(BIN)/python
PIP := $(PY) -m pip --disable-pip-version-check -q
export PATH := $(BIN):$(PATH)
# Where `make lab` works: a copy of examples/, ignored by git, so running and saving notebooks there
# never writes outputs into the tracked tutorials.
LAB_DIR ?= notebooks

# Offline belongs to the tests and benchmarks only: in `make lab`, nbgrad.load_model("gpt2") reaches the hub.
test bench fuzz: export HF_HUB_OFFLINE := 1
test bench fuzz: export TRANSFORMERS_OFFLINE := 1

.PHONY: lab lab-server test install extension bench fuzz clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to the CPU wheel: nothing later may resolve an unpinned torch into CUDA builds.
TORCH := torch==2.13.0
$(VENV)/.torch: | $(PY)
	$(PIP) install $(TORCH)
	touch $@

$(VENV)/.tools: $(VENV)/.torch
	$(PIP) install "jupyterlab>=4.6,<5" hatchling hatch-jupyter-builder jupyter-builder
	touch $@

# `npm install` with the committed lock: the registry here lacks rspack's other-platform optional
# binaries, which `npm ci` insists on finding in the lock.
node_modules/.package-lock.json: package.json package-lock.json
	npm install --no-audit --no-fund --no-save --loglevel=error

# The JupyterLab extension: TypeScript -> labextension/lib -> nbgrad/labextension (built with npm).
extension: $(VENV)/.tools node_modules/.package-lock.json
	npm run build:prod

# The package as users get it: a wheel that carries the prebuilt extension.
# With the `ray` extra (`--engine ray`), under a constraint that keeps the torch installed above.
install: extension
	echo "$(TORCH)" > $(VENV)/constraints.txt
	$(PIP) install --no-build-isolation -c $(VENV)/constraints.txt ".[dev,ray]"

lab: install
	@$(MAKE) --no-print-directory lab-server

# Tutorials missing from LAB_DIR are copied in; notebooks already there (your work) are kept as they are.
lab-server:
	@mkdir -p "$(LAB_DIR)"
	@for notebook in examples/*.ipynb; do \
		[ -e "$(LAB_DIR)/$${notebook##*/}" ] || cp "$$notebook" "$(LAB_DIR)/"; \
	done
	cd "$(LAB_DIR)" && $(BIN)/jupyter lab --ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root,) $(LAB_ARGS)

# Two workers (pytest-xdist): the browser tests wait on a server, a kernel and a page much of their time, which the
# other worker's tests fill (11.6 min against 16), and what must not run side by side is grouped onto one worker
# (tests/conftest.py). `make test TEST_WORKERS=0` runs everything in one process.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests

bench: install
	$(PY) bench/overhead.py
	$(PY) bench/phases.py
	$(PY) bench/generate.py
	$(PY) bench/memory.py
	$(PY) bench/panels.py
	$(PY) bench/widgets.py
	$(PY) bench/attribution.py
	$(PY) bench/cache.py
	$(PY) bench/source.py
	$(PY) bench/dataset_runs.py
	$(PY) bench/instructions.py

# The fuzz test with many random cells, and an interrupt at every line nbgrad runs (minutes).
fuzz: install
	NBGRAD_FUZZ_EXAMPLES=2000 NBGRAD_INTERRUPT_FULL=1 $(PY) -m pytest -q tests/test_fuzz_cells.py tests/test_interrupts.py

clean:
	rm -rf $(VENV) node_modules labextension/lib nbgrad/labextension build dist *.egg-info
