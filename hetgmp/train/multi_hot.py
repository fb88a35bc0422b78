"""Training on multi-hot data (issue 34, first slice): what runs, and the data and model set up.

Runs: one rank on CPU (``--device cpu``, no ``--partition``), ``hetgmp train`` /
``examples/hetuctr.py``: the data set's bags padded into its id matrix
(:mod:`hetgmp.data.multi_hot_padded`) and pooled per field by the model's lookup
(:mod:`hetgmp.models.pooling`, ``--pooling sum|mean``). Everything else (several ranks, a plan,
GPUs, ``--sync async``, the Python API's ``build_model``) is refused here, naming issue 34,
before anything is built: the exchange moving each distinct bag row once per step and the
fused GPU kernels are the next slices.
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
    if env.world_size > 1:
        why.append(f"{env.world_size} ranks (one rank only so far)")
    if env.device.type != "cpu":
        why.append(f"device {env.device.type} (CPU only so far: --device cpu)")
    if cfg.partition is not None:
        why.append("--partition (no plan with one rank)")
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
            f"{ds.root}: multi-hot fields ({names}) train with one rank on CPU so far "
            f"({ISSUE}); this run has {'; '.join(why)}"
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
            f"{ds.root}: multi-hot fields train through `hetgmp train` with one rank on CPU "
            f"so far ({ISSUE}); the Python API does not take them yet"
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
        f"--pooling {cfg.pooling} ({ISSUE}: one rank on CPU so far)"
    )
