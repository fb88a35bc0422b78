#!/usr/bin/env python
"""Train a CTR model, HET-GMP style.

    mpirun -np 8 python examples/hetuctr.py --model wdl --bound 100 --partition part.npz
    torchrun --nproc_per_node 2 examples/hetuctr.py --dataset data/criteo --batch_size 1024
    python examples/hetuctr.py            # one process, the generated default data set

The same options as ``hetgmp train`` (see ``--help``).
"""

import sys

from hetgmp.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
