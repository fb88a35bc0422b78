"""Thin script: the same as ``hetgmp experiment staleness ...``.

Example: ``python examples/experiments/staleness.py --data data/movielens --out results/staleness --ranks 4``
"""

import sys

from hetgmp.experiments.cli import main

if __name__ == "__main__":
    sys.exit(main("staleness"))
