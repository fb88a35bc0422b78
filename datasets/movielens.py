"""Convert ../shared/datasets/movielens-100k into our format (read in place, never copied).

    python datasets/movielens.py --out runs/movielens [--test-fraction 0.1 --seed 0]

Same as ``hetgmp preprocess movielens [SRC] --out OUT ...``.
"""

import sys

from hetgmp.cli import main

if __name__ == "__main__":
    sys.exit(main(["preprocess", "movielens", *sys.argv[1:]]))
