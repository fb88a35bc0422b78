"""Metadata of a dataset directory: ``meta.json``'s contents, the field layout and file names.

See :mod:`hetgmp.data.format` for the on-disk format these describe.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_NAME = "hetgmp-dataset"
FORMAT_VERSION = 2  # the newest this hetgmp reads; 2 adds multi-hot fields (hetgmp.data.multi_hot)
PLAIN_VERSION = 1  # what a directory without multi-hot fields is still written as
SPLITS = ("train", "test")
INT32_LIMIT = 2**31 - 1


class DatasetError(ValueError):
    """A dataset directory is missing, malformed or inconsistent; the message names the file."""


@dataclasses.dataclass
class FieldInfo:
    """One categorical field: its name, number of distinct ids and global id offset."""

    name: str
    cardinality: int
    offset: int


@dataclasses.dataclass
class DatasetMeta:
    """Contents of ``meta.json``."""

    fields: list[FieldInfo]
    num_dense: int
    splits: dict[str, int]
    id_dtype: str = "int32"
    name: str = ""
    fingerprint: str = ""
    source: dict[str, Any] = dataclasses.field(default_factory=dict)
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    best_auc: float | None = None  # AUC of the true probabilities on test (generated data)
    # per split, each column's smallest and largest global id ({"min": [...], "max": [...]}),
    # recorded when written, checked when training opens the data (hetgmp.data.id_ranges);
    # absent from directories written before it existed (those are scanned instead)
    id_ranges: dict[str, dict[str, list[int]]] = dataclasses.field(default_factory=dict)
    # Multi-hot fields (version 2): a list of ids per sample, laid out after ``fields`` in the
    # global id space, stored as values + offsets (hetgmp.data.multi_hot); per split and field,
    # samples, values, list lengths and id range as written.
    multi_hot: list[FieldInfo] = dataclasses.field(default_factory=list)
    multi_hot_stats: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    format: str = FORMAT_NAME
    version: int = PLAIN_VERSION

    @property
    def num_fields(self) -> int:
        return len(self.fields)

    @property
    def num_embeddings(self) -> int:
        """Rows of the whole id space: single-hot fields, then multi-hot ones."""
        return sum(f.cardinality for f in self.fields) + sum(f.cardinality for f in self.multi_hot)

    @property
    def field_offsets(self) -> np.ndarray:
        return np.array([f.offset for f in self.fields], dtype=np.int64)

    @property
    def field_cardinalities(self) -> np.ndarray:
        return np.array([f.cardinality for f in self.fields], dtype=np.int64)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["num_embeddings"] = self.num_embeddings
        if not self.multi_hot:  # (a version-1 meta.json stays byte-for-byte what it was)
            del d["multi_hot"], d["multi_hot_stats"]
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "meta.json") -> DatasetMeta:
        if d.get("format") != FORMAT_NAME:
            raise DatasetError(f"{where}: format is {d.get('format')!r}, expected {FORMAT_NAME!r}")
        if int(d.get("version", -1)) > FORMAT_VERSION:
            raise DatasetError(
                f"{where}: format version {d.get('version')} is newer than this hetgmp "
                f"supports ({FORMAT_VERSION}); upgrade hetgmp"
            )
        try:
            fields = [FieldInfo(**f) for f in d["fields"]]
            multi = [FieldInfo(**f) for f in d.get("multi_hot", [])]
            known = {f.name for f in dataclasses.fields(cls)}
            kw = {k: v for k, v in d.items() if k in known and k not in ("fields", "multi_hot")}
            meta = cls(fields=fields, multi_hot=multi, **kw)
        except (KeyError, TypeError) as err:
            raise DatasetError(f"{where}: malformed metadata ({err})") from err
        if meta.multi_hot and int(meta.version) < 2:
            raise DatasetError(f"{where}: multi_hot fields in a version {meta.version} directory")
        if "num_embeddings" in d and int(d["num_embeddings"]) != meta.num_embeddings:
            raise DatasetError(f"{where}: num_embeddings disagrees with the field cardinalities")
        return meta


def id_dtype_for(num_embeddings: int) -> np.dtype:
    """int32 where every id fits, int64 beyond."""
    return np.dtype(np.int32) if num_embeddings <= INT32_LIMIT else np.dtype(np.int64)


def make_fields(names: list[str], cardinalities: list[int]) -> list[FieldInfo]:
    """Fields laid out one after another in the global id space."""
    offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]]).astype(np.int64)
    return [
        FieldInfo(n, int(c), int(o)) for n, c, o in zip(names, cardinalities, offsets, strict=True)
    ]


def array_paths(root: Path, split: str) -> dict[str, Path]:
    return {
        "sparse": root / f"{split}_sparse_feats.npy",
        "dense": root / f"{split}_dense_feats.npy",
        "labels": root / f"{split}_labels.npy",
    }
