# The two commands of the README: `make demo` and `make test`. Each sets up its own virtual
# environment on first use (and again when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test lint bench bench-airflow clean

demo: $(STAMP)
	$(BIN)/airflow-broker demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest

# Benchmarks side by side with pgmq (about 15 minutes); BENCH_ARGS=--quick for a smoke run.
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

# From a SEND's commit to DAG code in a real Airflow deployment (about 5 minutes).
bench-airflow: $(STAMP)
	$(BIN)/python -m bench.airflow_latency $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "airflow-broker needs Python 3.11 or newer (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,airflow,spark,embedded]'
	rm -f $(VENV)/.installed-*
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
