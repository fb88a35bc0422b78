"""Convert ../shared/datasets/criteo-sample into our format (read in place, never copied).

    python datasets/criteo_sample.py --out runs/criteo-sample            # train / dev+test
    python datasets/criteo_sample.py --out runs/ref --hetgmp-reference   # HET-GMP encoding

Same as ``hetgmp preprocess criteo-sample [SRC] --out OUT ...``.
"""

import sys

from hetgmp.cli import main

if __name__ == "__main__":
    sys.exit(main(["preprocess", "criteo-sample", *sys.argv[1:]]))
