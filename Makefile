# The two commands of the README: `make demo` and `make test`. Each sets up its own virtual
# environment on first use (and again when pyproject.toml or constraints.txt changes), with
# the exact versions of constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS := dev,airflow,spark,embedded
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: demo test lint bench bench-airflow constraints clean

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

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "airflow-broker needs Python 3.11 or newer (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	rm -f $(VENV)/.installed-*
	touch $@

# Moves constraints.txt to the newest versions pyproject.toml's ranges allow: resolves them in
# a new environment, without the old pins, and writes down what it installed. Run the tests
# before committing the result.
constraints:
	rm -rf build/constraints-venv
	$(PYTHON) -m venv build/constraints-venv
	build/constraints-venv/bin/python -m pip install --quiet --upgrade pip
	build/constraints-venv/bin/python -m pip install --quiet -e '.[$(EXTRAS)]'
	{ sed -n '/^#/p' constraints.txt; \
	  build/constraints-venv/bin/python -m pip freeze --all --exclude-editable | sort -f; \
	} > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf build/constraints-venv

clean:
	rm -rf $(VENV) build *.egg-info
