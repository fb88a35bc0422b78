"""The real Criteo sample (``../shared/datasets/criteo-sample``) in our format.

Two encodings:

* :func:`convert_criteo_sample` (default): ``train.csv`` is train, ``dev.csv`` + ``test.csv``
  are test (7200 / 800 rows), preprocessed exactly like a Criteo TSV (``log(max(x,0)+2)``,
  ids by descending frequency, ``min_count`` threshold).
* :func:`encode_criteo_sample_hetgmp_reference`: the encoding HET-GMP's reference numbers assume:
  ALL 8000 rows (train, dev, test files in that order) as one training split, 26 categorical
  fields, ids per field in order of first appearance, every distinct value (empty included)
  its own id, no rare id (37,100 rows in all). Same as
  ``hetgmp preprocess criteo-sample DIR --out OUT --hetgmp-reference``.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from hetgmp.data.delimited import DelimitedSource, criteo_spec
from hetgmp.data.format import Dataset
from hetgmp.data.preprocess import PreprocessOptions, preprocess

FILES = ("train.csv", "dev.csv", "test.csv")


def _paths(src: Path) -> list[Path]:
    src = Path(src)
    paths = [src / f for f in FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"criteo sample files not found: {', '.join(missing)}")
    return paths


def convert_criteo_sample(
    src: str | Path,
    out: str | Path,
    *,
    reference: bool = False,
    options: PreprocessOptions | None = None,
) -> Dataset:
    """Write the sample as a dataset directory (``reference``: the HET-GMP encoding)."""
    paths = _paths(Path(src))
    opt = dataclasses.replace(options or PreprocessOptions(), name="criteo-sample")
    if reference:
        opt = dataclasses.replace(
            opt,
            id_order="first-appearance",
            min_count=1,
            test_fraction=0.0,
            reserve_rare_id=False,
            name="criteo-sample-hetgmp-reference",
        )
        return preprocess(DelimitedSource(paths, criteo_spec(), kind="criteo-tsv"), out, opt)
    return preprocess(
        DelimitedSource(paths[:1], criteo_spec(), kind="criteo-tsv"),
        out,
        opt,
        test_source=DelimitedSource(paths[1:], criteo_spec(), kind="criteo-tsv"),
    )


@dataclasses.dataclass
class ReferenceEncoding:
    """All 8000 rows: global ids [8000, 26] int64, labels [8000], dense [8000, 13]."""

    sparse: np.ndarray
    labels: np.ndarray
    dense: np.ndarray
    field_cardinalities: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.field_cardinalities.sum())


def encode_criteo_sample_hetgmp_reference(src: str | Path) -> ReferenceEncoding:
    """In-memory HET-GMP reference encoding of the sample (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        ds = convert_criteo_sample(
            src, Path(tmp) / "ref", reference=True, options=PreprocessOptions(progress=False)
        )
        tr = ds.train
        return ReferenceEncoding(
            sparse=np.array(tr.sparse, dtype=np.int64),
            labels=np.array(tr.labels, dtype=np.float32).ravel(),
            dense=np.array(tr.dense, dtype=np.float32),
            field_cardinalities=ds.meta.field_cardinalities,
        )
