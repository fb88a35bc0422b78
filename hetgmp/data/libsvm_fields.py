"""Which field a libsvm token belongs to, and what a libsvm label means.

Two line forms are read (:class:`LineForm`), one per input, detected from its first feature
token:

* **libfm** ``label field:id:value ...``: the field is written in the token.
* **plain libsvm** ``label index:value ...``: no field is written. By default the token's
  *position* is its field (the i-th token after the label is field i, as in the Criteo / Avazu
  libsvm files, whose lines hold one token per field in field order); every line must then
  hold the same number of tokens. ``--field-map FILE`` instead maps each feature index to a
  field (one-hot data whose lines hold different features, e.g. ``a9a``).

Labels: 0/1, or libsvm's -1/+1 read as 0/1 (:func:`map_labels`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hetgmp.data.arrow_values import FLOAT_RE, to_float
from hetgmp.data.bad_lines import BAD_LABEL, BadInputError

LIBFM = "libfm"
LIBSVM = "libsvm"
FORM_TOKEN = {LIBFM: "field:id:value", LIBSVM: "index:value"}
FORM_PARTS = {LIBFM: 3, LIBSVM: 2}
LABEL_MAPPING = "0 -> 0, 1 -> 1; libsvm's -1 -> 0, +1 -> 1"
# `hetgmp preprocess libsvm --help` (kept next to the rules it states)
LIBSVM_HELP = """\
libsvm / libfm lines, one sample per line; the form is detected from the first feature token,
and one input (train and --test-file together) holds one form:

  libfm         label field:id:value ...   field = the token's field (0-based)
  plain libsvm  label index:value ...      field = the token's position: the i-th token after
                                           the label is field i (as in the Criteo / Avazu
                                           libsvm files), so every line must hold one token
                                           per field; or, with --field-map FILE, the field
                                           that FILE gives the feature index

Every field is categorical, its id the token's id / index (the value is ignored, as in one-hot
data), except --dense-fields, whose value is the feature. A field absent from a line is a
missing value. Labels: 0/1, or libsvm's -1/+1, read as -1 -> 0, +1 -> 1 (logged once); any
other label is a bad line.

--multi-hot-fields F ...: fields whose tokens on a line form a bag (a user's history, an ad's
keywords): every token of the field adds its id, in line order (repeats count again); a line
without the field has an empty bag. Needs libfm lines or --field-map.

--field-map FILE: one 'index field' pair of non-negative integers a line ('#' comments); a
feature index not in FILE is a bad line, and so is a line where two indices map to one field.
"""


@dataclasses.dataclass(frozen=True)
class LineForm:
    """The line form of an input and the line that decided it (named in mixed-form errors)."""

    kind: str  # LIBFM or LIBSVM
    path: str
    line: int

    @property
    def parts(self) -> int:
        return FORM_PARTS[self.kind]

    def mismatch(self, token: str) -> str:
        """What to say about a token that does not have this form's shape."""
        other = LIBSVM if token.count(":") == 1 else LIBFM if token.count(":") == 2 else None
        base = f"token {token!r} is not {FORM_TOKEN[self.kind]}"
        if other is None or other == self.kind:
            return base
        return (
            f"{base}: it is the {other} form ({FORM_TOKEN[other]}), but this input is "
            f"{self.kind} ({FORM_TOKEN[self.kind]}, as {self.path}:line {self.line} shows); "
            "one input holds one form"
        )


def detect_form(paths: list[Path]) -> LineForm:
    """The form of the first feature token with 2 or 3 ``:``-separated parts in ``paths``."""
    for path in paths:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                for tok in raw.split()[1:]:
                    n = tok.count(b":") + 1
                    if n in (2, 3):
                        return LineForm(LIBFM if n == 3 else LIBSVM, str(path), lineno)
    raise BadInputError(
        f"{paths[0]}: no index:value (libsvm) or field:id:value (libfm) tokens found"
    )


@dataclasses.dataclass(frozen=True)
class FieldMap:
    """Feature index -> field, loaded from a ``--field-map`` file (see :func:`load_field_map`)."""

    path: str
    index: np.ndarray  # sorted feature indices (int64)
    field: np.ndarray  # the field of each

    @property
    def num_fields(self) -> int:
        return int(self.field.max()) + 1

    def lookup(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(field of every index, whether the index is in the map)."""
        pos = np.searchsorted(self.index, index)
        pos_c = np.minimum(pos, self.index.size - 1)
        found = (pos < self.index.size) & (self.index[pos_c] == index)
        return np.where(found, self.field[pos_c], -1), found


def load_field_map(path: Path) -> FieldMap:
    """Read lines ``index field`` (two non-negative integers; ``#`` starts a comment)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--field-map {path}: file not found")
    idx: list[int] = []
    fld: list[int] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, raw in enumerate(f, start=1):
            parts = raw.split("#", 1)[0].split()
            if not parts:
                continue
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise BadInputError(
                    f"{path}:line {lineno}: expected 'index field' (two non-negative "
                    f"integers), got {raw.strip()!r}"
                )
            idx.append(int(parts[0]))
            fld.append(int(parts[1]))
    if not idx:
        raise BadInputError(f"{path}: --field-map file has no 'index field' lines")
    index = np.asarray(idx, dtype=np.int64)
    order = np.argsort(index, kind="stable")
    index, field = index[order], np.asarray(fld, dtype=np.int64)[order]
    dup = np.flatnonzero(index[1:] == index[:-1])
    if dup.size:
        raise BadInputError(f"{path}: feature index {index[dup[0]]} is mapped twice")
    return FieldMap(str(path), index, field)


def map_labels(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """(0/1 labels, which values are valid labels, whether a -1 was seen).

    0 and 1 are themselves; libsvm's -1 is read as 0 (+1 parses as 1); anything else is bad.
    """
    ok = (values == 0.0) | (values == 1.0) | (values == -1.0)
    return np.where(values == -1.0, 0.0, values), ok, bool((values == -1.0).any())


def check_labels(
    lab_arr: pa.Array, empty: np.ndarray, flag: Callable[[np.ndarray, str, Any], None]
) -> tuple[np.ndarray, bool]:
    """A chunk's labels as 0/1 (``lab_arr``: the first token of every non-empty line, in line
    order; ``empty``: the empty lines) and whether a -1 was seen; ``flag(mask, reason,
    describe)`` reports the bad ones."""
    n = empty.size
    has = np.flatnonzero(~empty)
    lab_ok_t = np.asarray(
        pc.match_substring_regex(lab_arr, FLOAT_RE).to_numpy(zero_copy_only=False)
    )
    lab_val_t, valid, signed = map_labels(to_float(lab_arr, lab_ok_t))
    labels = np.zeros(n, dtype=np.float64)
    labels[has] = lab_val_t
    lab_ok = np.ones(n, dtype=bool)
    lab_ok[has] = lab_ok_t & valid
    lab_pos = np.full(n, -1)
    lab_pos[has] = np.arange(has.size)
    flag(
        ~lab_ok,
        BAD_LABEL,
        lambda i: f"label {lab_arr[int(lab_pos[i])].as_py()!r} is not 0/1 (or libsvm's -1/+1)",
    )
    return labels, signed
