"""Multi-hot fields of libfm / libsvm lines (issue 34): a field's tokens on a line form a bag.

``--multi-hot-fields F ...`` names fields that may appear several times on a line: every
well-formed token of such a field adds its id to the line's bag, in line order (a repeated id
counts again; the token's value is ignored, as for single-hot fields). A line without the field
has an empty bag. Every other field still holds at most one token per line (a repeated one is a
bad line). Bags need the field written in the token (libfm ``field:id:value``) or a
``--field-map``: by token position, every field is one token by construction.
"""

from __future__ import annotations

import numpy as np

from hetgmp.data.vocab import int_keys


def check_multi_hot_fields(
    multi_hot: list[int], dense: list[int], num_fields: int, by_position: bool
) -> None:
    """Raise ``ValueError`` for bag fields that are out of range, dense, or positional."""
    if not multi_hot:
        return
    bad = [f for f in multi_hot if not 0 <= f < num_fields]
    if bad:
        raise ValueError(f"--multi-hot-fields {bad} outside 0..{num_fields - 1}")
    both = sorted(set(multi_hot) & set(dense))
    if both:
        raise ValueError(f"fields {both} are in both --multi-hot-fields and --dense-fields")
    if by_position:
        raise ValueError(
            "--multi-hot-fields needs libfm lines (field:id:value) or a --field-map: in plain "
            "index:value lines the i-th token is field i, so no field can repeat"
        )


def repeated_field(
    row: np.ndarray, field: np.ndarray, good: np.ndarray, n: int, multi_hot: list[int]
) -> np.ndarray:
    """Per line, a single-hot field that appears more than once on it (-1: none): the usable
    tokens ``good`` of fields not in ``multi_hot`` are compared."""
    single = good & ~np.isin(field, multi_hot)
    r, f = row[single], field[single]
    order = np.lexsort((f, r))
    dup = (r[order][1:] == r[order][:-1]) & (f[order][1:] == f[order][:-1])
    out = np.full(n, -1)
    out[r[order][1:][dup]] = f[order][1:][dup]
    return out


def bags(
    row: np.ndarray, field: np.ndarray, ids: np.ndarray, keep: np.ndarray, multi_hot: list[int]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per bag field, ``(keys uint64 [E], offsets int64 [kept lines + 1])`` of the kept lines.

    ``row`` / ``field`` / ``ids`` are the usable tokens (in line order), ``keep`` the chunk's
    kept lines."""
    new_row = np.cumsum(keep) - 1  # (a kept line's position among the kept lines)
    n_kept = int(keep.sum())
    out = []
    for f in multi_hot:
        mine = (field == f) & keep[row]
        offsets = np.zeros(n_kept + 1, dtype=np.int64)
        np.cumsum(np.bincount(new_row[row[mine]], minlength=n_kept), out=offsets[1:])
        out.append((int_keys(ids[mine].astype(np.int64)), offsets))
    return out
