# fedshift: `make demo` and `make test` work from a fresh clone (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install data lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is pinned to the CPU wheel that pip finds on disk here (pyproject.toml).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

data: $(STAMP)
	$(BIN)/fedshift data fetch opencv
	$(BIN)/fedshift data build digits

# --new: a second `make demo` writes next to the first runs (run directories are never reused silently)
demo: data
	$(BIN)/fedshift run -c configs/demo.yaml --new

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest

bench: data
	$(BIN)/python benchmarks/engine_overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
