"""Which exchange several ranks' host tier trains with (issue 33): ``--exchange auto`` takes
the padded exchange where the whole step may be one CUDA graph (:func:`exchange_of`), and the
trainer trades it for the exact one before the first step where that flow then does not apply
(:func:`settle_exchange`: the samples are streamed, say). The table's own ``auto`` (the Python
API) keeps exact with a tier: an API user's eager padded steps never make the peers' rows
resident."""

from __future__ import annotations

from typing import Any

from hetgmp.comm.env import DistEnv
from hetgmp.embedding.options import resolve_replies
from hetgmp.embedding.tier_setup import check_owned_flow
from hetgmp.train.config import TrainConfig
from hetgmp.train.runlog import RunLog


def exchange_of(cfg: TrainConfig, env: DistEnv) -> str:
    """``--exchange`` as the table is given it: ``auto`` with several CUDA ranks' host tier,
    CUDA graphs and collective sync is ``padded`` where every reply comes (what padded needs:
    ``--replies`` resolved to ``all``), else the table's own ``auto``."""
    several_cuda = env.world_size > 1 and env.device.type == "cuda"
    if cfg.exchange == "auto" and cfg.rows_on == "host" and several_cuda and cfg.cuda_graphs:
        every_reply = resolve_replies(cfg.replies, env) == "all"
        return "padded" if cfg.sync == "collective" and every_reply else "auto"
    return cfg.exchange


def settle_exchange(table: Any, cfg: TrainConfig, whole_step: bool, log: RunLog) -> None:
    """(Before the first step) where the whole step does not apply (``whole_step`` False),
    the padded exchange that :func:`exchange_of` gave the host tier traded for the exact one,
    said in the log; then the flow check (padded with a tier outside the whole step refused)."""
    if not whole_step and cfg.exchange == "auto" and getattr(table, "owned", None) is not None:
        table.use_exact_exchange()
        log.info("exchange: exact after all (the host tier's padded one needs the whole step)")
    check_owned_flow(table, whole_step)
