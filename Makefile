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
test bench fuzz docs docs-picture: export HF_HUB_OFFLINE := 1
test bench fuzz docs docs-picture: export TRANSFORMERS_OFFLINE := 1

.PHONY: lab lab-server test install extension docs docs-check docs-picture bench fuzz clean

# Each build step prints one line while it works; what its tools print goes to build/logs/STEP.log, shown when
# the step fails. $(call step,NAME,WHAT,COMMAND)
LOGS := build/logs
step = @mkdir -p $(LOGS); echo "nbgrad: $(2) (log: $(LOGS)/$(1).log)"; \
	( $(3) ) > $(LOGS)/$(1).log 2>&1 || { tail -n 40 $(LOGS)/$(1).log; echo "nbgrad: $(2) failed"; exit 1; }

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to the CPU wheel: nothing later may resolve an unpinned torch into CUDA builds.
TORCH := torch==2.13.0
comma := ,
$(VENV)/.torch: | $(PY)
	$(call step,torch,installing $(TORCH) (CPU),$(PIP) install $(TORCH))
	@touch $@

$(VENV)/.tools: $(VENV)/.torch
	$(call step,tools,installing JupyterLab and the build tools,\
		$(PIP) install "jupyterlab>=4.6$(comma)<5" hatchling hatch-jupyter-builder jupyter-builder)
	@touch $@

# `npm install` with the committed lock: the registry here lacks rspack's other-platform optional
# binaries, which `npm ci` insists on finding in the lock.
node_modules/.package-lock.json: package.json package-lock.json
	$(call step,npm,installing the extension's npm packages,npm install --no-audit --no-fund --no-save --loglevel=error)

# The JupyterLab extension: TypeScript -> labextension/lib -> nbgrad/labextension (built with npm), rebuilt only
# when one of its sources is newer than the build (the files package.json lists, and the TypeScript settings).
EXTENSION := nbgrad/labextension/package.json
EXTENSION_SOURCES := $(shell find labextension/src labextension/style -type f) labextension/tsconfig.json \
	package.json nbgrad/views/panel.js nbgrad/views/panel.css
$(EXTENSION): $(EXTENSION_SOURCES) node_modules/.package-lock.json $(VENV)/.tools
	$(call step,extension,building the JupyterLab extension,npm run build:prod)
	@touch $@
extension: $(EXTENSION)

# The package as users get it: a wheel that carries the prebuilt extension, reinstalled only when the package,
# the extension or pyproject.toml is newer than the last install ($(VENV)/.installed), so that `make lab` after
# `make test` starts the server at once.
# With the `ray` extra (`--engine ray`), under a constraint that keeps the torch installed above.
PACKAGE_SOURCES := $(shell find nbgrad -type f -not -path 'nbgrad/labextension/*' -not -path '*/__pycache__/*')
$(VENV)/.installed: $(EXTENSION) $(PACKAGE_SOURCES) pyproject.toml install.json
	@echo "$(TORCH)" > $(VENV)/constraints.txt
	$(call step,install,installing nbgrad into $(VENV),\
		$(PIP) install --no-build-isolation -c $(VENV)/constraints.txt ".[dev$(comma)ray]")
	@touch $@
install: $(VENV)/.installed

lab: install
	@$(MAKE) --no-print-directory lab-server

# Tutorials missing from LAB_DIR are copied in; notebooks already there (your work) are kept as they are.
lab-server:
	@echo "nbgrad: JupyterLab on $(LAB_DIR)/ (a working copy of examples/); it prints its URL below"
	@mkdir -p "$(LAB_DIR)"
	@for notebook in examples/*.ipynb; do \
		[ -e "$(LAB_DIR)/$${notebook##*/}" ] || cp "$$notebook" "$(LAB_DIR)/"; \
	done
	cd "$(LAB_DIR)" && $(BIN)/jupyter lab --ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root,) $(LAB_ARGS)

# The documentation site: docs/*.md, the tutorials executed (once: build/jupyter_cache keeps their outputs until
# a tutorial's code changes) and the reference, as static HTML in site/. Warnings are errors.
$(VENV)/.docs-tools: pyproject.toml | $(VENV)/.installed
	$(call step,docs-tools,installing the documentation tools (the docs extra),\
		$(PIP) install --no-build-isolation -c $(VENV)/constraints.txt ".[docs]")
	@touch $@

docs: install $(VENV)/.docs-tools
	$(call step,docs,building the documentation site into site/ (tutorials run once; later builds reuse them),\
		$(PY) -m sphinx -b html -W --keep-going -q -d build/doctrees docs site)
	@echo "nbgrad: the site is in site/index.html"

# The built site with every tutorial, checked in a browser with the network blocked (`make test` checks a quicker
# build of two tutorials).
docs-check: docs
	NBGRAD_DOCS_SITE=site $(PY) -m pytest -q -p no:cacheprovider tests/browser/test_docs_site.py

# docs/images/panel.png, the panel on the README and the front page, and the sidebar's pictures in docs/sidebar.md,
# drawn again (needs Chromium; the sidebar's in JupyterLab).
docs-picture: install
	$(call step,docs-picture,drawing docs/images/panel.png,$(PY) docs/panel_picture.py)
	$(call step,docs-sidebar-pictures,drawing docs/images/sidebar-*.png,$(PY) docs/sidebar_pictures.py)

# Two workers (pytest-xdist): the browser tests wait on a server, a kernel and a page much of their time, which the
# other worker's tests fill (11.6 min against 16), and what must not run side by side is grouped onto one worker
# (tests/conftest.py). `make test TEST_WORKERS=0` runs everything in one process.
TEST_WORKERS ?= 2
test: install $(VENV)/.docs-tools       # tests/browser/test_docs_site.py builds the site
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 tests

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
	$(PY) bench/edits.py
	$(PY) bench/dataset_runs.py
	$(PY) bench/instructions.py

# The fuzz test with many random cells, and an interrupt at every line nbgrad runs: of a cell, of an edit and of a
# scan (minutes).
fuzz: install
	NBGRAD_FUZZ_EXAMPLES=2000 NBGRAD_INTERRUPT_FULL=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --timeout=3600 --durations=10 \
		tests/test_fuzz_cells.py tests/test_interrupts.py tests/test_interrupt_edits.py

clean:
	rm -rf $(VENV) node_modules labextension/lib nbgrad/labextension build dist *.egg-info site docs/_generated jupyter_execute
