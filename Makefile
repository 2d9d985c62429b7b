# fedshift: `make demo` and `make test` work from a fresh clone (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CORES  := $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)))")

.PHONY: demo test check install data lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pyproject.toml asks for version ranges; constraints.txt pins the exact versions installed
# here (torch: the CPU wheel that pip finds on disk). [dev]: every extra (flower, digits, mri)
# and the test tools, so that `make demo` and `make test` have all they use.
# pip compiles every installed module to bytecode in one process (~80 CPU s, most of the
# install's time: torch alone is ~10,000 files); --no-compile, then compileall with one
# process per core writes the same .pyc files in half the time on 2 cores. Every module is
# compiled (one left uncompiled would be compiled again by every process importing it where
# PYTHONDONTWRITEBYTECODE is set). compileall's status is not checked: like pip, it meets
# files of other Python versions that do not compile (torch/testing/_internal/py312_*.py)
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt -e ".[dev]"
	$(BIN)/python -m compileall -q -j $(CORES) $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") >/dev/null || true
	touch $(STAMP)

install: $(STAMP)

# fetch refreshes apt's package lists (--apt-update, needs root) only when apt-get download
# cannot find the package without it: what a fresh machine needs, and nothing otherwise
data: $(STAMP)
	$(BIN)/fedshift data fetch opencv || $(BIN)/fedshift data fetch opencv --apt-update
	$(BIN)/fedshift data build digits

# --new: a second `make demo` writes next to the first runs (run directories are never reused
# silently); --jobs 2: FedAvg and FedBN at the same time, each with one torch thread (the same
# numbers as one after the other)
demo: data
	$(BIN)/fedshift run -c configs/demo.yaml --new --jobs 2

# $(call beside_mypy,COMMAND): COMMAND (the tests) while mypy checks the types beside it,
# mypy's report printed when both are done; fails if either fails. mypy without its cache
# (a fresh clone) is ~50 CPU s on one core: run before the tests, it left the other core idle
# for a minute
beside_mypy = log=$$(mktemp); echo "$(BIN)/mypy (beside the tests; its report follows them)"; \
	$(BIN)/mypy >$$log 2>&1 & types=$$!; echo '$(1)'; $(1); rc=$$?; wait $$types; t=$$?; \
	echo "mypy:"; cat $$log; rm -f $$log; exit $$((rc || t))

# mypy: the type checker on core/, runtime/, algorithms/ and eval's metric-row readers
# ([tool.mypy] in pyproject.toml);
# its cache (.mypy_cache) makes a second run take seconds (the first reads torch's stubs)
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

# the whole suite, then the tests that compare floats once more on torch's portable CPU
# kernels (ATEN_CPU_CAPABILITY=default): a tolerance or constant that holds only for this
# CPU's kernels fails here, not on a user's machine. Bytecode is written even where the
# environment says not to (PYTHONDONTWRITEBYTECODE=1 on this kind of machine): otherwise
# every test worker rewrites every test module's asserts again and every process the tests
# start (CLI runs, pool workers, Flower ClientApps) compiles fedshift again. The second pass
# runs one worker per core: it has no Flower deployment to wait for (the first pass's extra
# worker), and every worker collects the whole suite (~12 CPU s each)
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	@$(call beside_mypy,PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest)
	PYTHONDONTWRITEBYTECODE= ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -m numerics -n $(CORES)

# the everyday loop: everything but the process-level tests (Flower deployment and Ray
# simulations, worker pools, kill / signal / resume, fresh interpreters, packaging) and the
# in-process tests of seconds each whose code cheaper tests run too (marked full: the
# documents' commands, algorithms' option and resume runs; tests/conftest.py FULL), one
# worker per core (no Flower workers to wait for) and bytecode kept between runs
check: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	@$(call beside_mypy,PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -m "not process and not full" -n $(CORES))

bench: data
	$(BIN)/python benchmarks/engine_overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
