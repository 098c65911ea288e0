"""The process of one activated reader, as the activation manager starts it:
``python -m airflow_broker.worker.activated_reader TARGET``. A module of its own, which the
worker package does not import: run with ``-m``, a module the package imports already would be
imported twice, and Python warns about that in every reader's log."""

from __future__ import annotations

import argparse
import sys

from airflow_broker.worker.activation import run_reader


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run one activated queue reader")
    parser.add_argument("target", help="package.module:function, or schema.procedure")
    return run_reader(parser.parse_args(argv).target)


if __name__ == "__main__":
    sys.exit(main())
