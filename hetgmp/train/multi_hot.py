"""Training on multi-hot data (issue 34): what runs, and the data and model set up.

Runs: ``hetgmp train`` / ``examples/hetuctr.py`` on CPU (``--device cpu``), one rank or several
gloo ranks, with or without a ``--partition`` plan (whose graph has one edge per bag id,
:mod:`hetgmp.partition.sample_rows`), any ``--bound`` and ``--store_rate``: the data set's bags
padded into its id matrix (:mod:`hetgmp.data.multi_hot_padded`) and pooled per field by the
model's lookup (:mod:`hetgmp.models.pooling`, ``--pooling sum|mean``). The lookup hands the
table every bag id (padding slots taken out) with the single-hot ids in one call, so the
table's step dedups them: each distinct row is fetched, and its summed gradient pushed, once per
step, as for single-hot ids. GPUs (the fused pooled kernels), ``--sync async``, ``--rows-on
host`` and the Python API's ``build_model`` are refused here, naming issue 34, before anything
is built.
"""

from __future__ import annotations

from typing import Any

from hetgmp.choices import parse_pooling
from hetgmp.data.dataset_meta import DatasetError
from hetgmp.data.dataset_reader import Dataset
from hetgmp.data.multi_hot_padded import PaddedBags, bag_widths
from hetgmp.models.pooling import BagLayout

ISSUE = "issue 34"


def unsupported(cfg: Any, env: Any) -> list[str]:
    """What of this run multi-hot training does not do yet (empty: it runs)."""
    why = []
    if env.device.type != "cpu":
        why.append(f"device {env.device.type} (CPU only so far: --device cpu)")
    if cfg.sync != "collective":
        why.append(f"--sync {cfg.sync}")
    if cfg.rows_on != "device":
        why.append(f"--rows-on {cfg.rows_on}")
    return why


def prepare(cfg: Any, env: Any, ds: Dataset) -> Dataset:
    """``ds`` as the trainer reads it: unchanged without multi-hot fields; with them, refused
    unless the run is supported (:func:`unsupported`), else the bags padded into the ids."""
    if not ds.meta.multi_hot:
        return ds
    why = unsupported(cfg, env)
    if why:
        names = ", ".join(f.name for f in ds.meta.multi_hot)
        raise DatasetError(
            f"{ds.root}: multi-hot fields ({names}) train on CPU with --sync collective and "
            f"rows on the device so far ({ISSUE}); this run has {'; '.join(why)}"
        )
    parse = parse_pooling(cfg.pooling, len(ds.meta.multi_hot))
    if len(parse) != len(ds.meta.multi_hot):
        raise DatasetError(
            f"--pooling {cfg.pooling}: {len(parse)} modes for the {len(ds.meta.multi_hot)} "
            f"multi-hot fields of {ds.root}; give one mode for all, or one per field"
        )
    return PaddedBags(ds, bag_widths(ds))


def bag_layout(cfg: Any, ds: Dataset) -> BagLayout | None:
    """The model's pooled lookup for ``ds`` (None without multi-hot fields); ``ds`` must come
    from :func:`prepare` (the Python API's data sets do not yet: refused, naming the issue)."""
    if not ds.meta.multi_hot:
        return None
    if not isinstance(ds, PaddedBags):
        raise DatasetError(
            f"{ds.root}: multi-hot fields train through `hetgmp train` on CPU so far "
            f"({ISSUE}); the Python API does not take them yet"
        )
    return BagLayout(
        num_single=ds.meta.num_fields,
        widths=tuple(ds.widths),
        pooling=parse_pooling(cfg.pooling, len(ds.widths)),
    )


def multi_hot_note(cfg: Any, ds: Dataset) -> str:
    """The log line saying how the bags train."""
    assert isinstance(ds, PaddedBags)
    fields = ", ".join(
        f"{f.name} (width {w})" for f, w in zip(ds.meta.multi_hot, ds.widths, strict=True)
    )
    return (
        f"multi-hot: {fields} padded into the id matrix (ids held in memory), pooled "
        f"--pooling {cfg.pooling} ({ISSUE}: CPU only so far)"
    )
