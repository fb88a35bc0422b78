"""The on-disk dataset directory (format ``hetgmp-dataset`` version 1; 2 with multi-hot fields).

Layout (file names compatible with HET-GMP's preprocessed Criteo directories)::

    meta.json                    this module's DatasetMeta, as JSON
    train_sparse_feats.npy       int32 or int64 [N, F]; global id = field offset + local id
    train_dense_feats.npy        float32 [N, num_dense]            (absent when num_dense == 0)
    train_labels.npy             float32 [N, 1]
    train_multi_hot_KKK_{values,offsets}.npy   version 2: multi-hot field KKK's lists, ragged
                                 (:mod:`hetgmp.data.multi_hot`)
    test_*.npy                   the same for the test split
    vocab/                       the vocabulary (raw key -> id per field, rare / missing ids,
                                 the dense transform; preprocessed data only), see
                                 :mod:`hetgmp.data.vocab_files`

The full format, vocabulary included, is documented in ``docs/dataset_format.md``.

Arrays are opened with ``mmap_mode="r"`` so data sets larger than RAM work. ids are int32 when
``num_embeddings < 2**31`` and int64 otherwise. The *fingerprint* is a SHA-256 over the shapes,
dtypes and bytes of every array plus the field cardinalities; plans and checkpoints record it and
refuse data whose fingerprint differs.

A directory written by HET-GMP's own preprocessing (the ``.npy`` files without ``meta.json``) is
accepted: its metadata is derived by scanning the arrays (per-field min/max give offsets and
cardinalities) and its fingerprint is computed the same way.

Writers stream: :class:`DatasetWriter` appends chunks to ``.npy`` files whose header is rewritten
with the final row count at the end, inside a temporary directory that is renamed into place only
when everything is written, so a crash never leaves a directory that looks complete.

Layout of the code: the metadata is in :mod:`hetgmp.data.dataset_meta`, opening and the
fingerprint in :mod:`hetgmp.data.dataset_reader`, writing in :mod:`hetgmp.data.dataset_writer`;
this module re-exports their names (the import path every caller uses).
"""

from __future__ import annotations

from hetgmp.data.dataset_meta import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INT32_LIMIT,
    SPLITS,
    DatasetError,
    DatasetMeta,
    FieldInfo,
    array_paths,
    id_dtype_for,
    make_fields,
)
from hetgmp.data.dataset_reader import (
    _HASH_CHUNK,
    Dataset,
    SplitArrays,
    _iter_chunks,
    _load_npy,
    _open_split,
    compute_fingerprint,
    derive_meta,
    open_dataset,
)
from hetgmp.data.dataset_writer import _HEADER_BYTES, DatasetWriter, _NpyAppender, write_dataset

__all__ = [
    "FORMAT_NAME", "FORMAT_VERSION", "INT32_LIMIT", "SPLITS", "_HASH_CHUNK", "_HEADER_BYTES",
    "Dataset", "DatasetError", "DatasetMeta", "DatasetWriter", "FieldInfo", "SplitArrays",
    "_NpyAppender", "_iter_chunks", "_load_npy", "_open_split", "array_paths",
    "compute_fingerprint", "derive_meta", "id_dtype_for", "make_fields", "open_dataset",
    "write_dataset",
]  # fmt: skip
