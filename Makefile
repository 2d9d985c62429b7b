# fedshift: `make demo` and `make test` work from a fresh clone (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install data lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pyproject.toml asks for version ranges; constraints.txt pins the exact versions installed
# here (torch: the CPU wheel that pip finds on disk). [dev]: every extra (flower, digits, mri)
# and the test tools, so that `make demo` and `make test` have all they use.
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
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
