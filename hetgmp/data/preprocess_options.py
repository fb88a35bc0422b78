"""The options of :func:`hetgmp.data.preprocess.preprocess` (``hetgmp preprocess``): how raw
values become ids and rows become splits.

In a module of their own, below both :mod:`hetgmp.data.preprocess` (the two passes) and
:mod:`hetgmp.data.preprocess_vocab` (where the ids come from, which reads these options), so
that neither has to import the other for them. :mod:`hetgmp.data.preprocess` re-exports both
names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hetgmp.data.bad_lines import BadLineReport
from hetgmp.data.vocab import ID_ORDERS

SPLIT_MODES = ("tail", "random")


@dataclasses.dataclass
class PreprocessOptions:
    """How raw values become ids and rows become splits (see the module docstring)."""

    min_count: int = 1
    id_order: str = "frequency"
    test_fraction: float = 0.1
    split: str = "tail"
    seed: int = 0
    on_bad_line: str = "error"
    progress: bool = True
    name: str = ""
    overwrite: bool = False
    reserve_rare_id: bool = False
    vocab_from: Path | None = None  # encode with this data set's vocabulary (no counting)
    grow_vocab: bool = False  # with vocab_from: new values get ids appended (vocab_grow.py)

    def check(self) -> None:
        if self.min_count < 1:
            raise ValueError(f"--min-count must be >= 1, got {self.min_count}")
        if self.id_order not in ID_ORDERS:
            raise ValueError(f"--id-order {self.id_order!r} is not one of {ID_ORDERS}")
        if not 0.0 <= self.test_fraction < 1.0:
            raise ValueError(f"--test-fraction must be in [0, 1), got {self.test_fraction}")
        if self.split not in SPLIT_MODES:
            raise ValueError(f"--split {self.split!r} is not one of {SPLIT_MODES}")
        BadLineReport(self.on_bad_line)
