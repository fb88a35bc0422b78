"""What a saved vocabulary records about its input: key schemes, the dense transform, the reader.

A vocabulary (:mod:`hetgmp.data.vocab_store`) must reproduce preprocessing on new raw data, so
besides the key -> id maps it records, from the :class:`~hetgmp.data.preprocess_stream.RowSource`
that made them:

* the **key scheme** of every field: how a raw value became a ``uint64`` key (``hex``:
  Criteo's hex parsed exactly; ``fnv1a64``: 64-bit FNV-1a of the UTF-8 bytes; ``int``: splitmix64
  of the integer; empty / null is :data:`~hetgmp.data.vocab.MISSING_KEY` in every scheme);
* the **dense transform** (missing -> 0, then ``log(max(x, 0) + 2)`` or the identity);
* the **reader** settings (column spec, libsvm fields, parquet columns), so that
  :func:`source_from_input` can rebuild an identical reader for new files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.data.delimited import DelimitedSource, DelimitedSpec
from hetgmp.data.delimited_spec import transform_dense

KEY_SCHEMES = ("hex", "fnv1a64", "int", "unknown")
DENSE_FORMULAS = {
    "log": "missing -> 0; y = log(max(x, 0) + 2) (negatives clipped to 0 first)",
    "none": "missing -> 0; y = x",
}


class VocabError(ValueError):
    """A vocabulary is missing, malformed or does not fit the data; the message names the file."""


def vocab_field_names(source: Any) -> list[str]:
    """The fields a vocabulary of ``source`` holds: its single-hot categoricals, then its
    multi-hot columns (issue 34; none for most readers)."""
    return list(source.field_names) + list(getattr(source, "multi_hot_names", []))


def key_schemes(source: Any) -> list[str]:
    """The key scheme of every field of ``source``'s vocabulary (see the module docstring)."""
    from hetgmp.data.libsvm import LibsvmSource

    n = len(vocab_field_names(source))
    if hasattr(source, "key_schemes"):  # a reader that states its own
        return list(source.key_schemes)
    if isinstance(source, DelimitedSource):
        return ["hex" if source.spec.categorical_kind == "hex" else "fnv1a64"] * n
    if isinstance(source, LibsvmSource):
        return ["int"] * n
    return ["unknown"] * n


def dense_transform_of(source: Any) -> str:
    """The dense transform name (``log`` / ``none``) a reader applies."""
    if isinstance(source, DelimitedSource):
        return source.spec.dense_transform
    return str(getattr(source, "dense_transform", "none"))


def dense_record(source: Any) -> dict[str, Any]:
    """The ``dense`` entry of a vocabulary manifest."""
    transform = dense_transform_of(source)
    return {
        "names": list(source.dense_names),
        "transform": transform,
        "missing_value": 0.0,
        "formula": DENSE_FORMULAS.get(transform, transform),
    }


def apply_dense(raw: np.ndarray, transform: str, missing_value: float = 0.0) -> np.ndarray:
    """Dense values as preprocessing stores them: NaN (missing) -> ``missing_value``, then the
    transform; float32."""
    x = np.asarray(raw, dtype=np.float64)
    x = np.where(np.isnan(x), missing_value, x)
    return transform_dense(x, transform)


def input_record(source: Any) -> dict[str, Any]:
    """Reader settings that :func:`source_from_input` turns back into a reader."""
    from hetgmp.data.libsvm import LibsvmSource
    from hetgmp.data.parquet_reader import ParquetSource

    if isinstance(source, DelimitedSource):
        return {"reader": "delimited", "kind": source.kind, "spec": dataclasses.asdict(source.spec)}
    if isinstance(source, LibsvmSource):
        return {
            "reader": "libsvm",
            "num_fields": source.num_fields,
            "dense_fields": list(source.dense_fields),
            "multi_hot_fields": list(source.multi_hot_fields),
            "dense_transform": source.dense_transform,
        }
    if isinstance(source, ParquetSource):
        return {
            "reader": "parquet",
            "label": source.label,
            "dense": list(source.dense),
            "categorical": list(source.categorical),
            "multi_hot": list(source.multi_hot),
            "dense_transform": source.dense_transform,
        }
    return {"reader": str(getattr(source, "kind", type(source).__name__))}


def source_from_input(record: dict[str, Any], paths: list[Path], *, where: str, **kw: Any) -> Any:
    """A reader for ``paths`` configured as recorded (``kw``: e.g. ``block_bytes``)."""
    from hetgmp.data.libsvm import LibsvmSource
    from hetgmp.data.parquet_reader import ParquetSource

    reader = record.get("reader")
    try:
        if reader == "delimited":
            spec = DelimitedSpec(**record["spec"])
            return DelimitedSource(list(paths), spec, kind=record.get("kind", "delimited"), **kw)
        if reader == "libsvm":
            return LibsvmSource(
                list(paths),
                num_fields=record["num_fields"],
                dense_fields=record["dense_fields"],
                dense_transform=record["dense_transform"],
                multi_hot_fields=record.get("multi_hot_fields", []),
                **kw,
            )
        if reader == "parquet":
            return ParquetSource(
                list(paths),
                label=record["label"],
                dense=record["dense"],
                categorical=record["categorical"],
                dense_transform=record["dense_transform"],
                multi_hot=record.get("multi_hot", []),  # (absent: written before issue 34)
                **kw,
            )
    except (KeyError, TypeError) as err:
        raise VocabError(f"{where}: malformed input record ({err!r})") from err
    raise VocabError(
        f"{where}: the data was read by {reader!r}, which cannot read new raw files; "
        "encode their keys with Vocabulary.encode / encode_values instead"
    )
