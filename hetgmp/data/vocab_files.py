"""The vocabulary files of a dataset directory (``vocab/``, ``vocab_version`` 1).

Layout (documented in ``docs/dataset_format.md``)::

    vocab/manifest.json     format, vocab_version, min_count, id_order, the dense transform,
                            the reader settings, and per field: name, offset, cardinality,
                            key scheme, rare / missing / unseen id, key count, file names, sha256
    vocab/NNN.keys.npy      uint64 [k]: the field's kept raw keys, strictly increasing
    vocab/NNN.ids.npy       int32 (int64 past 2**31) [k]: the local id of each key

Only kept keys (seen at least ``min_count`` times) are stored: every other value maps to the
field's *unseen id* anyway, so Criteo-scale vocabularies stay a few bytes per kept value.
Writing is done inside the dataset writer's temporary directory, so it is atomic with the data.
Reading checks what is cheap (presence, dtype, shape); :func:`check_field` reads every byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.data.dataset_meta import INT32_LIMIT, FieldInfo
from hetgmp.data.vocab import MISSING_KEY, FieldVocab
from hetgmp.data.vocab_input import VocabError, dense_record, input_record, key_schemes
from hetgmp.filecheck import inside, sha256

VOCAB_DIR = "vocab"
MANIFEST = "manifest.json"
VOCAB_FORMAT = "hetgmp-vocab"
VOCAB_VERSION = 1
UNSEEN_RULE = (
    "a value not in the vocabulary gets the field's rare id; a field without a rare id gives "
    "it the missing value's id, and a field without either its last id (under frequency order "
    "the least frequent kept value); preprocess --reserve-rare-id avoids the fallbacks"
)


def vocab_dir(root: str | Path) -> Path:
    return Path(root) / VOCAB_DIR


def has_vocabulary(root: str | Path) -> bool:
    """True when the dataset directory holds a vocabulary (older directories do not)."""
    return (vocab_dir(root) / MANIFEST).is_file()


def unseen_id(rare_id: int | None, missing_id: int | None, cardinality: int) -> tuple[int, str]:
    """The local id an unseen value gets, and which rule gave it (see :data:`UNSEEN_RULE`)."""
    if rare_id is not None:
        return rare_id, "rare"
    if missing_id is not None:
        return missing_id, "missing"
    return cardinality - 1, "last"


def write_vocabulary(
    root: Path,
    fields: list[FieldInfo],
    vocabs: list[FieldVocab],
    source: Any,
    *,
    min_count: int,
    id_order: str,
    reserve_rare: bool,
) -> None:
    """Write ``root/vocab/`` from the per-field maps preprocessing built (see module docstring)."""
    out = vocab_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    schemes = key_schemes(source)
    entries = []
    for f, (info, v) in enumerate(zip(fields, vocabs, strict=True)):
        kept = v.ids != v.rare_id if v.rare_id is not None else np.ones(v.keys.size, bool)
        id_dtype = np.int32 if info.cardinality <= INT32_LIMIT else np.int64
        names = {"keys": f"{f:03d}.keys.npy", "ids": f"{f:03d}.ids.npy"}
        np.save(out / names["keys"], np.ascontiguousarray(v.keys[kept], dtype=np.uint64))
        np.save(out / names["ids"], np.ascontiguousarray(v.ids[kept], dtype=id_dtype))
        unseen, rule = unseen_id(v.rare_id, v.missing_id, info.cardinality)
        entries.append({
            "name": info.name,
            "offset": info.offset,
            "cardinality": info.cardinality,
            "key_scheme": schemes[f],
            "rare_id": v.rare_id,
            "missing_id": v.missing_id,
            "unseen_id": unseen,
            "unseen_rule": rule,
            "num_keys": int(kept.sum()),
            "keys_file": names["keys"],
            "ids_file": names["ids"],
            "sha256": {k: sha256(out / n) for k, n in names.items()},
        })  # fmt: skip
    manifest = {
        "format": VOCAB_FORMAT,
        "vocab_version": VOCAB_VERSION,
        "num_embeddings": int(sum(f.cardinality for f in fields)),
        "min_count": min_count,
        "id_order": id_order,
        "reserve_rare_id": reserve_rare,
        "missing_key": str(int(MISSING_KEY)),
        "unseen_rule": UNSEEN_RULE,
        "dense": dense_record(source),
        "input": input_record(source),
        "fields": entries,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))


_FIELD_KEYS = ("name", "offset", "cardinality", "key_scheme", "rare_id", "missing_id",
               "unseen_id", "num_keys", "keys_file", "ids_file")  # fmt: skip


FILE_KEYS = ("keys_file", "ids_file")
MAX_ROWS = 1 << 40  # the most rows (ids) a field may declare


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The parsed ``vocab/manifest.json``; :class:`VocabError` naming the file when bad."""
    path = vocab_dir(root) / MANIFEST
    if not path.is_file():
        raise VocabError(
            f"{path}: no vocabulary in {root} (directories written before vocabularies were "
            "saved, or by `hetgmp generate`, have none; preprocess the raw data again)"
        )
    try:
        m = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise VocabError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(m, dict) or m.get("format") != VOCAB_FORMAT:
        got = m.get("format") if isinstance(m, dict) else type(m).__name__
        raise VocabError(f"{path}: format is {got!r}, expected {VOCAB_FORMAT!r}")
    version = m.get("vocab_version")
    if not isinstance(version, int) or version < 1:
        raise VocabError(f"{path}: vocab_version {version!r} is not a positive integer")
    if version > VOCAB_VERSION:
        raise VocabError(
            f"{path}: vocab_version {version} is newer than this hetgmp supports "
            f"({VOCAB_VERSION}); upgrade hetgmp"
        )
    fields = m.get("fields")
    if not isinstance(fields, list) or not fields:
        raise VocabError(f"{path}: 'fields' must be a non-empty list")
    for i, e in enumerate(fields):
        missing = [k for k in _FIELD_KEYS if not isinstance(e, dict) or k not in e]
        if missing:
            raise VocabError(f"{path}: field {i} lacks {', '.join(missing)}")
        for k in ("offset", "cardinality", "num_keys"):  # (before any comparison or allocation)
            v = e[k]
            if type(v) is not int or not 0 <= v <= MAX_ROWS:
                raise VocabError(f"{path}: field {e['name']}: {k} {v!r} is not an integer in "
                                 f"[0, {MAX_ROWS}]")  # fmt: skip
        for k in FILE_KEYS:
            inside(vocab_dir(root), e[k], VocabError, where=f"{path}: field {e['name']}: {k}")
        for k in ("rare_id", "missing_id", "unseen_id"):
            v = e[k]
            if v is not None and not (isinstance(v, int) and 0 <= v < e["cardinality"]):
                raise VocabError(
                    f"{path}: field {e['name']}: {k} {v!r} is outside [0, {e['cardinality']})"
                )
    for k in ("dense", "input", "min_count", "id_order"):
        if k not in m:
            raise VocabError(f"{path}: lacks {k!r}")
    return m


def _load(path: Path, mmap: bool) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise VocabError(f"{path}: vocabulary file is missing") from None
    except (ValueError, OSError, EOFError) as err:
        raise VocabError(f"{path}: not a readable .npy file ({err})") from err


def load_field(root: str | Path, entry: dict[str, Any], *, mmap: bool) -> tuple[np.ndarray, ...]:
    """(keys, ids) of one manifest entry, with dtypes and shapes checked (cheap)."""
    d = vocab_dir(root)
    kp, ip = (inside(d, entry[k], VocabError, where=f"{d / MANIFEST}: {k}") for k in FILE_KEYS)
    keys, ids = _load(kp, mmap), _load(ip, mmap)
    n = entry["num_keys"]
    if keys.dtype != np.uint64 or keys.shape != (n,):
        raise VocabError(f"{kp}: {keys.dtype} {keys.shape}, expected uint64 ({n},)")
    if ids.dtype.kind != "i" or ids.shape != (n,):
        raise VocabError(f"{ip}: {ids.dtype} {ids.shape}, expected int32/int64 ({n},)")
    return keys, ids


def check_field(root: str | Path, entry: dict[str, Any], *, checksums: bool) -> list[str]:
    """Every problem of one field's files (each message names its file); [] when sound.

    Reads every byte: keys strictly increasing, ids distinct and in ``[0, cardinality)`` and
    never the rare id, and (``checksums``) the sha256 recorded in the manifest.
    """
    d = vocab_dir(root)
    try:
        keys, ids = load_field(root, entry, mmap=True)
    except VocabError as err:
        return [str(err)]
    problems = []
    kp, ip = d / entry["keys_file"], d / entry["ids_file"]
    if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        first = int(np.flatnonzero(keys[1:] <= keys[:-1])[0])
        problems.append(f"{kp}: keys not strictly increasing (at index {first + 1})")
    card = int(entry["cardinality"])
    bad = (ids < 0) | (ids >= card)
    if entry["rare_id"] is not None:
        bad |= ids == entry["rare_id"]
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        problems.append(
            f"{ip}: {int(bad.sum())} ids outside [0, {card}) or equal to the rare id; "
            f"first at index {first} (id {int(ids[first])})"
        )
    elif ids.size:
        if card <= 8 * ids.size + (1 << 20):
            seen = np.zeros(card, bool)  # O(n) marks: a sort of a memory map is far slower
            seen[ids] = True
            distinct = int(np.count_nonzero(seen))
        else:  # (a cardinality far above the ids' count: a byte per id would not fit)
            distinct = int(np.unique(ids).size)
        if distinct != ids.size:
            problems.append(f"{ip}: two keys share one id")
    for kind, path in (("keys", kp), ("ids", ip)):
        want = entry.get("sha256", {}).get(kind)
        if checksums and want and sha256(path) != want:
            problems.append(f"{path}: sha256 differs from {MANIFEST} (file changed or corrupted)")
    return problems
