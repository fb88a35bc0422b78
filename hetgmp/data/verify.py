"""Checking a dataset directory end to end: what ``hetgmp dataset verify`` runs.

Opening a data set (:func:`hetgmp.data.format.open_dataset`) checks shapes cheaply; verifying reads
every byte: it recomputes the content fingerprint and compares it with ``meta.json``, checks that
every id lies in its field's range, that labels are 0/1 and that dense features are finite, and,
when the directory holds a vocabulary (``vocab/``), that its manifest matches ``meta.json``'s
fields and every key / id file is sound (shape, sorted keys, ids in range, sha256).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from hetgmp.data.format import (
    SPLITS,
    Dataset,
    DatasetError,
    array_paths,
    compute_fingerprint,
    open_dataset,
)
from hetgmp.data.multi_hot_verify import check_multi_hot, describe_multi_hot
from hetgmp.data.vocab_files import MANIFEST, check_field, has_vocabulary, read_manifest, vocab_dir
from hetgmp.data.vocab_input import VocabError

_ROWS = 1 << 18  # rows per chunk while scanning


@dataclasses.dataclass
class VerifyReport:
    """Outcome of :func:`verify_dataset`: one line per check, and the failures."""

    lines: list[str] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def good(self, msg: str) -> None:
        self.lines.append(f"ok    {msg}")

    def bad(self, msg: str) -> None:
        self.lines.append(f"FAIL  {msg}")
        self.failures.append(msg)


def verify_dataset(path: str | os.PathLike[str]) -> VerifyReport:
    """Read every array of the data set at ``path`` and report what is wrong.

    A directory that cannot even be opened raises :class:`DatasetError`; problems found while
    scanning are collected in the report (so one run lists all of them).
    """
    ds = open_dataset(path)
    rep = VerifyReport()
    fp = compute_fingerprint(ds.root, ds.meta)
    if ds.derived:
        rep.good(f"fingerprint {fp[:16]}... (derived; no meta.json to compare with)")
    elif fp == ds.meta.fingerprint:
        rep.good(f"fingerprint {fp[:16]}... matches meta.json")
    else:
        rep.bad(
            f"fingerprint mismatch: meta.json records {ds.meta.fingerprint[:16]}..., "
            f"the files hash to {fp[:16]}... (files changed or corrupted)"
        )
    for split in SPLITS:
        if not ds.has_split(split):
            rep.good(f"{split}: absent")
            continue
        try:
            arrays = ds.split(split)
        except DatasetError as err:
            rep.bad(f"{split}: {err}")
            continue
        _check_split(ds, split, arrays, rep)
        for k, field in enumerate(ds.meta.multi_hot):
            check_multi_hot(ds.root, split, k, field, arrays.multi_hot[k], rep)
    _check_vocabulary(ds, rep)
    return rep


def _check_vocabulary(ds: Dataset, rep: VerifyReport) -> None:
    """The vocabulary against ``meta.json`` and byte by byte; absent is fine (older data)."""
    if not has_vocabulary(ds.root):
        rep.good("vocabulary: absent (written before vocabularies were saved, or generated)")
        return
    try:
        m = read_manifest(ds.root)
    except VocabError as err:
        rep.bad(str(err))
        return
    where = vocab_dir(ds.root) / MANIFEST
    got = [(e["name"], e["offset"], e["cardinality"]) for e in m["fields"]]
    # (a vocabulary holds the single-hot fields, then the multi-hot ones: issue 34)
    want = [(f.name, f.offset, f.cardinality) for f in [*ds.meta.fields, *ds.meta.multi_hot]]
    if got != want:
        rep.bad(f"{where}: fields (name, offset, cardinality) {got} differ from meta.json's {want}")
        return
    problems = [p for e in m["fields"] for p in check_field(ds.root, e, checksums=True)]
    for p in problems:
        rep.bad(p)
    if not problems:
        keys = sum(int(e["num_keys"]) for e in m["fields"])
        rep.good(
            f"vocabulary v{m['vocab_version']}: {len(m['fields'])} fields, {keys} keys, sorted, "
            "ids in range, checksums match"
        )


def _check_split(ds: Dataset, split: str, arrays, rep: VerifyReport) -> None:
    paths = array_paths(ds.root, split)
    lo = ds.meta.field_offsets
    hi = lo + ds.meta.field_cardinalities
    n = len(arrays)
    bad_ids = np.zeros(ds.meta.num_fields, dtype=np.int64)
    first_bad: dict[int, tuple[int, int]] = {}
    bad_labels, first_label = 0, -1
    bad_dense, first_dense = 0, -1
    for start in range(0, n, _ROWS):
        sp = np.asarray(arrays.sparse[start : start + _ROWS])
        out = (sp < lo) | (sp >= hi)
        if out.any():
            bad_ids += out.sum(axis=0)
            for f in np.flatnonzero(out.any(axis=0)):
                if int(f) not in first_bad:
                    r = int(np.flatnonzero(out[:, f])[0])
                    first_bad[int(f)] = (start + r, int(sp[r, f]))
        lab = np.asarray(arrays.labels[start : start + _ROWS]).ravel()
        wrong = (lab != 0) & (lab != 1)
        if wrong.any():
            bad_labels += int(wrong.sum())
            if first_label < 0:
                first_label = start + int(np.flatnonzero(wrong)[0])
        if arrays.dense is not None:
            de = np.asarray(arrays.dense[start : start + _ROWS])
            nonfinite = ~np.isfinite(de).all(axis=1)
            if nonfinite.any():
                bad_dense += int(nonfinite.sum())
                if first_dense < 0:
                    first_dense = start + int(np.flatnonzero(nonfinite)[0])
    if bad_ids.any():
        for fi, (row, val) in sorted(first_bad.items()):
            field = ds.meta.fields[fi]
            rep.bad(
                f"{paths['sparse'].name}: {int(bad_ids[fi])} ids of field {field.name} outside "
                f"[{lo[fi]}, {hi[fi]}); first at row {row} (id {val})"
            )
    else:
        rep.good(f"{paths['sparse'].name}: {n} rows, every id within its field's range")
    if bad_labels:
        rep.bad(f"{paths['labels'].name}: {bad_labels} labels not 0/1; first at row {first_label}")
    else:
        pos = float(np.asarray(arrays.labels, dtype=np.float64).mean()) if n else float("nan")
        rep.good(f"{paths['labels'].name}: labels 0/1, positive rate {pos:.4f}")
    if arrays.dense is not None:
        if bad_dense:
            rep.bad(
                f"{paths['dense'].name}: {bad_dense} rows with NaN/inf; first at row {first_dense}"
            )
        else:
            rep.good(f"{paths['dense'].name}: all values finite")


def missing_files(ds: Dataset) -> list[str]:
    """The array files ``meta.json``'s splits call for that are not in the directory."""
    out = []
    for split, count in sorted(ds.meta.splits.items()):
        if not count:
            continue
        for kind, path in array_paths(ds.root, split).items():
            if (kind != "dense" or ds.meta.num_dense > 0) and not path.exists():
                out.append(path.name)
    return out


def describe(ds: Dataset) -> list[str]:
    """Human-readable summary lines of a data set's metadata (``hetgmp dataset info``)."""
    m = ds.meta
    lines = [
        f"dataset      {ds.root}",
        f"format       {m.format} v{m.version}"
        + (" (derived, no meta.json)" if ds.derived else ""),
        "splits       " + ", ".join(f"{k}={v}" for k, v in sorted(m.splits.items())),
        f"fields       {m.num_fields} categorical, {len(m.multi_hot)} multi-hot, "
        f"{m.num_dense} dense",
        f"rows         {m.num_embeddings} embedding rows, ids {m.id_dtype}",
        f"fingerprint  {m.fingerprint}",
        "vocabulary   "
        + ("vocab/ (hetgmp.data.vocab_store.Vocabulary)" if has_vocabulary(ds.root) else "none"),
    ]
    missing = missing_files(ds)
    if missing:
        lines.append(f"MISSING      {', '.join(missing)} (meta.json lists the split)")
    if m.best_auc is not None:
        lines.append(f"best_auc     {m.best_auc:.6f} (AUC of the true probabilities on test)")
    if m.source:
        lines.append(
            f"source       {m.source.get('kind', '?')} {m.source.get('generator', '')}".rstrip()
        )
    lines.append("field        cardinality  offset")
    for f in m.fields:
        lines.append(f"  {f.name:<10} {f.cardinality:>11}  {f.offset}")
    lines += describe_multi_hot(m)
    for k, v in sorted(m.stats.items()):
        lines.append(f"stats.{k} = {v}")
    return lines


__all__ = ["VerifyReport", "describe", "missing_files", "verify_dataset"]
