"""Training on multi-hot data (issue 34): what runs, and the data and model set up.

Runs: ``hetgmp train`` / ``examples/hetuctr.py`` on CPU (``--device cpu``), one rank or several
gloo ranks, with or without a ``--partition`` plan (whose graph has one edge per bag id,
:mod:`hetgmp.partition.sample_rows`), any ``--bound`` and ``--store_rate``: the data set's bags
padded into its id matrix (:mod:`hetgmp.data.multi_hot_padded`) and pooled per field by the
model's lookup (:mod:`hetgmp.models.pooling`, ``--pooling sum|mean``). The lookup hands the
table every bag id (padding slots taken out) with the single-hot ids in one call, so the
table's step dedups them: each distinct row is fetched, and its summed gradient pushed, once per
step, as for single-hot ids. Under ``--sync async`` the same ids go to the row service (the
loop of unequal steps sends the next batch's reads ahead with
:meth:`~hetgmp.models.ctr.CTRModel.table_ids`, the tensor the lookup then hands the table).
``--rows-on host`` likewise: the host tier is handed those ids, and the trainer's read-ahead
(:mod:`hetgmp.train.lookahead`) tells it each next batch's as that same tensor, so their rows
are made resident a step ahead. Several CUDA ranks train them with :data:`GPU_RANKS` (the bags
in fixed shapes, the multi-rank whole step; off: refused here, naming issue 34, before anything
is built); with :data:`GPU_ONE_RANK` on, one CUDA rank trains
(the pooling on the fused Triton kernels with ``--kernels auto|triton``,
:mod:`hetgmp.models.pooling_fused`; the step's dense part replayed as a CUDA graph, the whole
step not: :func:`hetgmp.train.graphed.graph_support` says why). The Python API
(``hetgmp.build_model`` / ``Trainer``) prepares its data set here too (:func:`prepare`,
:func:`pooling_option`, :func:`matching`), so it trains what the CLI trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hetgmp.choices import POOLINGS, parse_pooling
from hetgmp.comm.collectives import guarded
from hetgmp.data.dataset_meta import DatasetError
from hetgmp.data.dataset_reader import Dataset
from hetgmp.data.multi_hot_padded import PaddedBags, bag_widths
from hetgmp.models.pooling import BagLayout
from hetgmp.models.pooling_fused import resolve_pooling

ISSUE = "issue 34"
# One CUDA rank trains multi-hot data (the fused pooling kernels) when on. On since its first
# GPU run (1x H100, 2026-11-26): tests/gpu_multi_hot_check.py passes (GPU == CPU run), and
# bench/gpu/multi_hot_bag.py measured 2.06x / 3.60x a plain nn.EmbeddingBag WDL at batch 8192 /
# 65536 (bench/results/gpu/multi_hot_bag). Off: the CPU-only refusal, a diagnosis.
GPU_ONE_RANK = True
# The pooled lookup in fixed shapes (BagLayout.fixed: the table is handed every bag slot, a
# padding slot standing in for a row its sample holds, masked out by the pooling): what a
# whole-step CUDA graph of several ranks needs. Exact (bound 0 equals one process on CPU,
# tests/test_train_multi_hot_dist.py); off until measured on GPUs, where the compact lookup
# and its fused kernels are the measured path.
FIXED_SHAPE = False
# Several CUDA ranks train multi-hot data when on: the bags in fixed shapes (forced there) and
# the multi-rank whole step as one CUDA graph (hetgmp.train.graphed_multi; the next batch
# planned ahead from its table ids). Its flow on gloo ranks equals the eager padded path's
# (tests/test_whole_step_bags.py); on since tests/gpu_whole_step_bags_check.py passed on 2 H100s
# (2026-11-27, the bags pooled from float32 rows under autocast): 2 GPUs 1.42x one at batch
# 8192 with 2 bags of mean length 20 (bench/results/gpu/multi_hot_2gpu/).
GPU_RANKS = True
# Several CUDA ranks hand the table the batch's bag values packed into a fixed capacity, not
# every padded slot (BagLayout.compact): at 2 bags of mean length 20 padded to 39 each, ~66
# ids a sample instead of 104 through the plan, the lookup and the rows' gradient sum. Exact
# (tests/test_bags_compact.py). On since measured on 2 H100s (2026-11-27,
# bench/results/gpu/bags_compact/: 2 GPUs 0.86x -> 1.93x one at batch 8192 with those bags;
# tests/gpu_whole_step_bags_check.py compact passed).
COMPACT = True
# One CUDA rank takes the compact fixed lookup too, so that its whole step is one CUDA graph
# (train/graphed.py; the capacity set at the resident samples' epoch starts, a batch past it
# eager): its default reads the pooled lookup's size on the host every step, which made one
# GPU's multi-hot figure move 2.87M-4.85M samples/s between calls on 2 H100s
# (bench/results/gpu/bags_compact/). Samples not resident on the device: the variable layout
# still (the capacity comes from resident epochs; Trainer._one_source). Exact
# (tests/test_bags_compact.py; tests/gpu_multi_hot_check.py on an H100). On since measured on
# 2 H100s (2026-11-27, bench/results/gpu/one_rank_compact/: one GPU 2.95M -> 5.16M samples/s
# at batch 8192 with 2 bags of mean length 20).
ONE_RANK_COMPACT = True
# The compact capacity (bag values per batch) fixed up front; 0: set at the first epoch start
# from its batches (BagLayout.fit). Tests fix it, so that runs without an epoch check agree.
COMPACT_CAPACITY = 0


def unsupported(cfg: Any, env: Any) -> list[str]:
    """What of this run multi-hot training does not do yet (empty: it runs): only its device
    now (``cfg`` is kept for what a later refusal may name)."""
    why = []
    if env.device.type == "cuda":
        if not GPU_ONE_RANK:
            why.append("device cuda (CPU only so far: --device cpu)")
        elif env.world_size > 1 and not GPU_RANKS:
            why.append(f"{env.world_size} CUDA ranks (one GPU only so far)")
    elif env.device.type != "cpu":
        why.append(f"device {env.device.type} (CPU only so far: --device cpu)")
    return why


def pooling_option(value: str | Sequence[str]) -> str:
    """The Python API's ``pooling=``: ``"sum"``, ``"sum,mean"`` or a sequence of modes (one for
    every multi-hot field, or one per field), as ``--pooling``'s text; a wrong type or an
    unknown mode is refused here, naming the option and the modes there are."""
    if isinstance(value, str):
        modes = value.split(",")
    elif isinstance(value, Sequence) and value and all(isinstance(v, str) for v in value):
        modes = list(value)
    else:
        raise TypeError(
            f"pooling: expected a mode ('sum' or 'mean'), a comma-separated string or a "
            f"non-empty sequence of modes (one per multi-hot field), got {value!r}"
        )
    bad = [m for m in modes if m not in POOLINGS]
    if bad:
        raise ValueError(f"pooling: unknown mode {bad[0]!r} in {value!r}; modes: {POOLINGS}")
    return ",".join(modes)


def prepare(cfg: Any, env: Any, ds: Dataset, *, api: bool = False) -> Dataset:
    """``ds`` as the trainer reads it: unchanged without multi-hot fields; with them, refused
    unless the run is supported (:func:`unsupported`), else the bags padded into the ids.
    ``api``: a wrong count of pooling modes names ``pooling=`` (the API's), not ``--pooling``."""
    if not ds.meta.multi_hot:
        return ds
    why = unsupported(cfg, env)
    if why:
        names = ", ".join(f.name for f in ds.meta.multi_hot)
        raise DatasetError(
            f"{ds.root}: multi-hot fields ({names}) train on CPU or one GPU so far ({ISSUE}); "
            f"this run has {'; '.join(why)}"
        )
    parse = parse_pooling(cfg.pooling, len(ds.meta.multi_hot))
    option = f"pooling={cfg.pooling!r}" if api else f"--pooling {cfg.pooling}"
    if len(parse) != len(ds.meta.multi_hot):
        raise DatasetError(
            f"{option}: {len(parse)} modes for the {len(ds.meta.multi_hot)} "
            f"multi-hot fields of {ds.root} ({', '.join(f.name for f in ds.meta.multi_hot)}); "
            "give one mode for all, or one per field"
        )
    return PaddedBags(ds, bag_widths(ds))


def bag_layout(
    cfg: Any, ds: Dataset, device: torch.device | None = None, world: int = 1
) -> BagLayout | None:
    """The model's pooled lookup for ``ds`` (None without multi-hot fields); ``ds`` must come
    from :func:`prepare` (``hetgmp train`` and ``hetgmp.build_model`` pass theirs through it).
    ``device``: where it runs, for its pooling backend (``--kernels``; None: torch's);
    ``world``: its ranks (several CUDA ranks take the fixed shapes: their step is one graph)."""
    if not ds.meta.multi_hot:
        return None
    if not isinstance(ds, PaddedBags):
        raise DatasetError(
            f"{ds.root}: its multi-hot fields are not padded into the ids: pass the data set "
            f"through hetgmp.train.multi_hot.prepare first (hetgmp.build_model does; {ISSUE})"
        )
    layout = BagLayout(
        num_single=ds.meta.num_fields,
        widths=tuple(ds.widths),
        pooling=parse_pooling(cfg.pooling, len(ds.widths)),
        backend="torch" if device is None else resolve_pooling(cfg.kernels, device),
        fixed=FIXED_SHAPE or _fixed_on(device, world, host=getattr(cfg, "rows_on", "") == "host"),
        compact=COMPACT,
    )
    if COMPACT_CAPACITY:
        layout.set_capacity(COMPACT_CAPACITY)
    return layout


def _fixed_on(device: torch.device | None, world: int, *, host: bool = False) -> bool:
    """Whether bags on ``device`` take fixed shapes: several CUDA ranks (their step is one
    graph), one CUDA rank with :data:`ONE_RANK_COMPACT` and its rows on the device (``host``:
    ``--rows-on host``, whose one-GPU tier with multi-hot bags is checked on GPUs with the
    variable layout only, tests/gpu_multi_hot_check.py)."""
    cuda = device is not None and device.type == "cuda"
    return cuda and (world > 1 or (ONE_RANK_COMPACT and COMPACT and not host))


def bag_fits(
    bags: BagLayout, env: Any, steps: int, sparse: torch.Tensor, positions: torch.Tensor,
    batch_size: int,
) -> list[bool]:  # fmt: skip
    """(Collective, at an epoch start) for each of the epoch's ``steps`` whether its batches
    have their bag values within a compact lookup's capacity on every rank (the most over
    ranks: the ranks decide alike which steps replay their graph, and share one capacity,
    :meth:`BagLayout.fit`); all True when not compact."""
    if not (bags.fixed and bags.compact) or steps == 0:
        return [True] * steps
    need = torch.zeros(steps, dtype=torch.int64, device=sparse.device)
    mine = bags.bag_values(sparse, positions, batch_size)
    k = min(steps, mine.numel())
    need[:k] = mine[:k]
    if env.group is not None and env.world_size > 1:
        with guarded(env, "epoch bag values maxima"):
            dist.all_reduce(need, op=dist.ReduceOp.MAX, group=env.group)
    return bags.fit(need.tolist(), batch_size)


def bag_verdicts(
    bags: BagLayout, env: Any, steps: int, sparse: torch.Tensor, positions: torch.Tensor,
    batch_size: int, note: Any,
) -> list[bool]:  # fmt: skip
    """(Collective, at an epoch start) :func:`bag_fits`, the log told through ``note`` what
    :func:`bag_fit_notes` says (the capacity when this call sets it)."""
    first = not bags.capacity
    fits = bag_fits(bags, env, steps, sparse, positions, batch_size)
    for line in bag_fit_notes(bags, fits, first=first):
        note(line)
    return fits


def bag_fit_notes(bags: BagLayout, fits: list[bool], *, first: bool) -> list[str]:
    """What the log says after :func:`bag_fits`: the compact capacity (``first``: once), and
    how many of the epoch's batches are past it (those train eagerly)."""
    if not (bags.fixed and bags.compact) or not fits:
        return []
    out = []
    if first:
        out.append(f"multi-hot: each batch's bag values packed into {bags.capacity} table ids "
                   "(the first epoch's batches' most, +2 % and 256)")  # fmt: skip
    over = fits.count(False)
    if over:
        out.append(f"multi-hot: {over} of this epoch's {len(fits)} batches hold more bag values "
                   "than that: they train eagerly")  # fmt: skip
    return out


def multi_hot_note(cfg: Any, ds: Dataset) -> str:
    """The log line saying how the bags train."""
    assert isinstance(ds, PaddedBags)
    fields = ", ".join(
        f"{f.name} (width {w})" for f, w in zip(ds.meta.multi_hot, ds.widths, strict=True)
    )
    return (
        f"multi-hot: {fields} padded into the id matrix (ids held in memory), pooled "
        f"--pooling {cfg.pooling} ({ISSUE})"
    )


def matching(cfg: Any, env: Any, ds: Dataset, built: Dataset | None, bags: Any) -> Dataset:
    """The data set the Python API's ``Trainer`` reads for ``ds``: ``ds`` itself without
    multi-hot fields; the prepared one its model was built on (``built``) when it holds the
    same data, else ``ds`` prepared afresh. Refused when the model (its ``bags``, a
    :class:`~hetgmp.models.pooling.BagLayout` or None) does not pool this data set's bags."""
    if not ds.meta.multi_hot or isinstance(ds, PaddedBags):
        out = ds
    elif isinstance(built, PaddedBags) and built.fingerprint == ds.fingerprint:
        out = built  # (its padded splits already read once)
    else:
        out = prepare(cfg, env, ds, api=True)
    if not isinstance(out, PaddedBags):
        if bags is not None:
            raise DatasetError(f"{ds.root}: no multi-hot fields, but the model pools bags")
        return out
    if bags is None:
        raise DatasetError(
            f"{ds.root}: multi-hot fields, but the model pools no bags: build it with "
            "hetgmp.build_model on this data set"
        )
    if tuple(out.widths) != tuple(bags.widths):
        raise DatasetError(
            f"{ds.root}: its bags are {tuple(out.widths)} ids wide, the model was built for "
            f"{tuple(bags.widths)}: build it with hetgmp.build_model on this data set"
        )
    return out
