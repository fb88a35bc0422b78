"""The end-to-end demo behind ``make demo``: generate, partition, train on CPU ranks."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="runs/demo", help="working directory")
    parser.add_argument("--np", type=int, default=4, help="number of CPU ranks")
    parser.parse_args(argv)
    print("demo: stages not wired yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
