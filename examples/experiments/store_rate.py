"""Thin script: the same as ``hetgmp experiment store-rate ...``.

Example: ``python examples/experiments/store_rate.py --data data/movielens --out results/store_rate --ranks 4``
"""

import sys

from hetgmp.experiments.cli import main

if __name__ == "__main__":
    sys.exit(main("store-rate"))
