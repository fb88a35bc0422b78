"""The padded exchange: the collective engine's fixed-capacity transport, so that a training
step replays as CUDA graphs.

``exchange.py`` (:class:`~.exchange.PaddedExchange`, the driver: capacities, ring slots,
graph release), ``buffers.py`` (:class:`~.buffers.StaticExchange`: the buffers and segments of
one capacity), ``fields.py`` (what the segments see of them), ``graphs.py`` (the graph cache
and the preprocessing ring), ``whole.py`` (the set-up for a whole-step graph of several
ranks); the segments: ``kernels.py`` (host side of the fused Triton kernels),
``kernels_triton.py`` and ``presync_triton.py`` (the kernels) and ``reference.py`` (the same
segments in torch ops, their reference).

(No imports here: see :mod:`hetgmp.embedding.collective`.)
"""
