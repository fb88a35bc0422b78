"""Thin CLI: ``python partition/partition.py -n 8 -o part.npz [--data DIR] ...``.

Same options as ``hetgmp partition`` (see ``--help``); without ``--data`` it partitions the
default generated criteo-like data set (made once and cached under ~/.cache/hetgmp).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from hetgmp.cli import main as hetgmp_main

    # Delegate to `hetgmp partition` so errors print cleanly through one code path.
    return hetgmp_main(["partition", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
