"""Thin script: the same as ``hetgmp experiment partition ...``.

Example: ``python examples/experiments/partition_compare.py --data data/movielens --out results/partition_compare --ranks 4``
"""

import sys

from hetgmp.experiments.cli import main

if __name__ == "__main__":
    sys.exit(main("partition"))
