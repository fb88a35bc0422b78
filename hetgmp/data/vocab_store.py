"""A dataset's saved vocabulary: encode new raw data with exactly the ids preprocessing gave.

::

    vocab = Vocabulary.load("data/criteo")
    ids = vocab.encode("C1", keys)                 # uint64 keys -> global ids
    ids = vocab.encode_values("C1", ["68fd1e64", ""])   # raw values -> global ids
    for block in vocab.encode_files(["day_24.tsv"]):    # raw files, read as preprocess reads
        block.ids, block.dense, block.labels, block.lines

A value not in the vocabulary gets its field's *unseen id* (the rare id, or the fallbacks of
:data:`~hetgmp.data.vocab_files.UNSEEN_RULE`), so every value has a valid id. The files are
described in :mod:`hetgmp.data.vocab_files`; how keys are made in :mod:`hetgmp.data.vocab`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from hetgmp.data.bad_lines import BadLineReport
from hetgmp.data.delimited_spec import RawBlock
from hetgmp.data.vocab import MISSING_KEY, hex_keys, int_keys, string_keys
from hetgmp.data.vocab_files import (
    MANIFEST,
    check_field,
    has_vocabulary,
    load_field,
    read_manifest,
    vocab_dir,
)
from hetgmp.data.vocab_input import (
    VocabError,
    apply_dense,
    dense_transform_of,
    key_schemes,
    source_from_input,
    vocab_field_names,
)

__all__ = ["EncodedBlock", "FieldVocabulary", "Vocabulary", "VocabError", "has_vocabulary"]

_UNIQUE_ABOVE = 1024  # longer inputs are deduplicated before the search


@dataclasses.dataclass
class FieldVocabulary:
    """One field's saved map: sorted kept keys, their local ids, and the special ids."""

    name: str
    offset: int
    cardinality: int
    key_scheme: str
    keys: np.ndarray  # uint64 [k], strictly increasing
    ids: np.ndarray  # int [k], local ids
    rare_id: int | None
    missing_id: int | None
    unseen_id: int  # what a value not in ``keys`` gets (always valid)

    def encode_local(self, keys: np.ndarray) -> tuple[np.ndarray, int]:
        """(local ids int64, number of keys not in the vocabulary) of uint64 ``keys``."""
        flat = keys.ravel()
        inverse = None
        if flat.size > _UNIQUE_ABOVE:
            # Raw data repeats its values a lot: search the distinct ones, spread back.
            flat, inverse = np.unique(flat, return_inverse=True)
        pos = np.searchsorted(self.keys, flat)
        if self.keys.size:
            pos_c = np.minimum(pos, self.keys.size - 1)
            found = (pos < self.keys.size) & (self.keys[pos_c] == flat)
            out = np.where(found, self.ids[pos_c].astype(np.int64), self.unseen_id)
        else:
            found = np.zeros(flat.shape, bool)
            out = np.full(flat.shape, self.unseen_id, np.int64)
        if inverse is not None:
            unseen = int(np.count_nonzero(~found[inverse]))
            out = out[inverse]
        else:
            unseen = int(np.count_nonzero(~found))
        return out.reshape(keys.shape), unseen


@dataclasses.dataclass
class EncodedBlock:
    """Rows of raw input encoded as preprocessing would: global ids, dense, labels, lines."""

    path: str
    lines: np.ndarray  # int64 [n]: 1-based line (row) number of each row in ``path``
    ids: np.ndarray  # int64 [n, num_fields]: global ids
    dense: np.ndarray | None  # float32 [n, num_dense], transformed
    labels: np.ndarray  # float32 [n]
    # per multi-hot field: (global ids int64 [E], offsets int64 [n + 1]); see encode_lists
    lists: list[tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)


class Vocabulary:
    """The vocabulary of a dataset directory (see the module docstring)."""

    def __init__(self, root: Path, manifest: dict[str, Any], fields: list[FieldVocabulary]):
        self.root = root
        self.manifest = manifest
        self.fields = fields
        self._index = {f.name: i for i, f in enumerate(fields)}

    @classmethod
    def load(cls, root: str | Path, *, mmap: bool = True, check: bool = True) -> Vocabulary:
        """Open ``root/vocab/``. ``check`` reads every key and id once (sortedness, ranges),
        since an unsorted file would silently give wrong ids; checksums are left to
        ``hetgmp dataset verify``. Errors are :class:`VocabError` naming the bad file."""
        root = Path(root)
        m = read_manifest(root)
        fields = []
        for e in m["fields"]:
            if check:
                problems = check_field(root, e, checksums=False)
                if problems:
                    raise VocabError("; ".join(problems))
            keys, ids = load_field(root, e, mmap=mmap)
            fields.append(
                FieldVocabulary(
                    name=e["name"],
                    offset=int(e["offset"]),
                    cardinality=int(e["cardinality"]),
                    key_scheme=e["key_scheme"],
                    keys=keys,
                    ids=ids,
                    rare_id=e["rare_id"],
                    missing_id=e["missing_id"],
                    unseen_id=int(e["unseen_id"]),
                )  # fmt: skip
            )
        return cls(root, m, fields)

    @property
    def manifest_path(self) -> Path:
        return vocab_dir(self.root) / MANIFEST

    @property
    def version(self) -> int:
        return int(self.manifest["vocab_version"])

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    @property
    def num_fields(self) -> int:
        return len(self.fields)

    @property
    def num_embeddings(self) -> int:
        return sum(f.cardinality for f in self.fields)

    @property
    def dense_names(self) -> list[str]:
        return list(self.manifest["dense"]["names"])

    @property
    def dense_transform(self) -> str:
        return str(self.manifest["dense"]["transform"])

    def field(self, field: str | int) -> FieldVocabulary:
        """A field by name or 0-based index."""
        if isinstance(field, str):
            if field not in self._index:
                raise KeyError(f"no field {field!r}; fields: {', '.join(self.field_names)}")
            return self.fields[self._index[field]]
        if not 0 <= int(field) < len(self.fields):
            raise IndexError(f"field index {field} outside 0..{len(self.fields) - 1}")
        return self.fields[int(field)]

    def encode(self, field: str | int, keys: np.ndarray, *, local: bool = False) -> np.ndarray:
        """Global ids (``local``: ids within the field) of uint64 ``keys`` of one field."""
        keys = np.asarray(keys)
        if keys.dtype != np.uint64:
            raise TypeError(
                f"keys must be uint64 keys, got {keys.dtype}; raw values go to encode_values"
            )
        fv = self.field(field)
        ids, _ = fv.encode_local(keys)
        return ids if local else ids + fv.offset

    def keys_of(self, field: str | int, values: Sequence[Any] | pa.Array) -> np.ndarray:
        """uint64 keys of raw values by the field's key scheme (None / "" = missing)."""
        fv = self.field(field)
        if fv.key_scheme == "hex":
            keys, invalid = hex_keys(pa.array(values, pa.string()))
            if invalid.any():
                bad = values[int(np.flatnonzero(invalid)[0])]
                raise ValueError(f"field {fv.name}: {bad!r} is not a hex value of <= 15 digits")
            return keys
        if fv.key_scheme == "fnv1a64":
            return string_keys(pa.array(values).cast(pa.string()))
        if fv.key_scheme == "int":
            arr = pa.array(values, pa.int64())
            null = arr.is_null().to_numpy(zero_copy_only=False)
            k = int_keys(arr.fill_null(0).to_numpy(zero_copy_only=False))
            return np.where(null, MISSING_KEY, k)
        raise VocabError(f"{self.manifest_path}: field {fv.name} has key scheme {fv.key_scheme!r}")

    def encode_values(self, field: str | int, values: Sequence[Any] | pa.Array) -> np.ndarray:
        """Global ids of raw values of one field."""
        return self.encode(field, self.keys_of(field, values))

    def encode_block(self, block: RawBlock) -> np.ndarray:
        """Global ids int64 ``[n, F]`` of a reader's block's single-hot ``keys`` (the fields
        before its multi-hot ones, whose ``lists`` :meth:`encode_lists` encodes)."""
        return self.encode_keys(block.keys, fields=self.num_fields - len(block.lists))[0]

    def encode_lists(self, block: RawBlock) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per multi-hot field of a reader's block (the vocabulary's last fields, in order):
        ``(global ids int64 [E], offsets int64 [n + 1])``, every list value encoded as
        preprocessing encodes it (a value not held: the field's unseen id)."""
        first = self.num_fields - len(block.lists)
        out = []
        for fv, (keys, offsets) in zip(self.fields[first:], block.lists, strict=True):
            local, _ = fv.encode_local(np.asarray(keys, dtype=np.uint64))
            out.append((local + fv.offset, np.asarray(offsets, dtype=np.int64)))
        return out

    def encode_keys(
        self, keys: np.ndarray, *, fields: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(global ids [n, F], per-field count of keys not in the vocabulary) of ``keys [n, F]``
        of the first ``F = fields`` fields (default: all of them)."""
        want = self.num_fields if fields is None else fields
        if keys.ndim != 2 or keys.shape[1] != want:
            raise ValueError(f"keys have shape {keys.shape}, expected [n, {want}]")
        ids = np.empty(keys.shape, np.int64)
        unseen = np.zeros(want, np.int64)
        for f, fv in enumerate(self.fields[:want]):
            local, unseen[f] = fv.encode_local(keys[:, f])
            ids[:, f] = local + fv.offset
        return ids, unseen

    def transform_dense(self, raw: np.ndarray) -> np.ndarray:
        """Raw dense values (NaN = missing) as preprocessing stores them (float32)."""
        d = self.manifest["dense"]
        return apply_dense(raw, d["transform"], float(d.get("missing_value", 0.0)))

    def make_source(self, paths: Sequence[str | Path], **kw: Any) -> Any:
        """A reader of new raw files set up as the one that made this vocabulary."""
        return source_from_input(
            self.manifest["input"], [Path(p) for p in paths], where=str(self.manifest_path), **kw
        )

    def encode_files(
        self, paths: Sequence[str | Path], *, on_bad_line: str = "error", **kw: Any
    ) -> Iterator[EncodedBlock]:
        """Stream raw files as preprocessing reads them (bad lines: ``error`` / ``skip``),
        block by block, with every row's global ids and line number."""
        source = self.make_source(paths, **kw)
        self.check_source(source)
        report = BadLineReport(on_bad_line, unit=getattr(source, "unit", "line"))
        for block in source.iter_blocks(report):
            yield EncodedBlock(
                block.path, block.lines, self.encode_block(block), block.dense, block.labels,
                self.encode_lists(block),
            )  # fmt: skip

    def check_source(self, source: Any) -> None:
        """Refuse a reader whose fields, dense columns, key schemes or dense transform differ
        from this vocabulary's (its ids would mean something else)."""
        where = self.manifest_path
        if vocab_field_names(source) != self.field_names:
            raise VocabError(
                f"{where}: the input's categorical fields (single-hot, then multi-hot) "
                f"{vocab_field_names(source)} differ from the vocabulary's {self.field_names}"
            )
        if list(source.dense_names) != self.dense_names:
            raise VocabError(
                f"{where}: the input's dense columns {list(source.dense_names)} differ from "
                f"the vocabulary's {self.dense_names}"
            )
        transform = dense_transform_of(source)
        if source.dense_names and transform != self.dense_transform:
            raise VocabError(
                f"{where}: the input's dense transform {transform!r} differs from the "
                f"vocabulary's {self.dense_transform!r} (see --dense-transform)"
            )
        for fv, scheme in zip(self.fields, key_schemes(source), strict=True):
            if scheme != fv.key_scheme:
                raise VocabError(
                    f"{where}: field {fv.name}: the input makes {scheme!r} keys, the vocabulary "
                    f"holds {fv.key_scheme!r} keys"
                )
