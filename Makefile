# nbgrad: `make lab` opens JupyterLab on the tutorials; `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
PY := $(BIN)/python
PIP := $(PY) -m pip --disable-pip-version-check -q
export PATH := $(BIN):$(PATH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: lab test install extension bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to the CPU wheel: nothing later may resolve an unpinned torch into CUDA builds.
$(VENV)/.torch: | $(PY)
	$(PIP) install torch==2.13.0
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
install: extension
	$(PIP) install --no-build-isolation ".[dev]"

lab: install
	cd examples && $(BIN)/jupyter lab --ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root,) $(LAB_ARGS)

test: install
	$(PY) -m pytest -q tests

bench: install
	$(PY) bench/overhead.py
	$(PY) bench/generate.py
	$(PY) bench/memory.py
	$(PY) bench/panels.py

clean:
	rm -rf $(VENV) node_modules labextension/lib nbgrad/labextension build dist *.egg-info
