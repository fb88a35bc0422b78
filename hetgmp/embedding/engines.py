"""Which step engines a table runs, from its settings: one rank's own step, the padded
exchange (fixed capacities, CUDA graphs), the collective stepper (exact sizes, and the
padded exchange where every rank takes it) or the async row service."""

from __future__ import annotations

from hetgmp.embedding.collective.stepper import Stepper
from hetgmp.embedding.context import StepContext
from hetgmp.embedding.local import LocalStep
from hetgmp.embedding.padded.exchange import PaddedExchange
from hetgmp.embedding.rowservice import AsyncConfig, AsyncStep


def make_engines(
    ctx: StepContext, *, exchange: str, audit: bool, sync: str, cuda_graphs: bool, graph_collectives: bool,
    async_config: AsyncConfig | None,
) -> tuple[bool, LocalStep | None, PaddedExchange | None, Stepper | AsyncStep]:  # fmt: skip
    """``(one rank's own step applies, that step, the padded exchange, the stepper)``. The
    one-rank step (no audit) needs slot == id: rank 0 owns every row and mirrors nothing."""
    env, store = ctx.env, ctx.store
    local = env.world_size == 1 and not audit and store.n_own == store.num_rows
    local = local and store.n_mir == 0
    one = LocalStep(ctx) if local else None
    graphs = bool(cuda_graphs) and env.device.type == "cuda"
    padded = None
    if exchange == "padded" and not local:
        padded = PaddedExchange(ctx, graphs=graphs, graph_collectives=bool(graph_collectives))
    stepper: Stepper | AsyncStep = Stepper(ctx, padded)
    if sync == "async" and not local:  # (one rank: nothing to sync)
        stepper = AsyncStep(ctx, async_config or AsyncConfig())
    return local, one, padded, stepper
