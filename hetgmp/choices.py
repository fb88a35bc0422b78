"""The names the command line offers (models, kernels, exchanges, ...).

They live here, in a module that imports nothing heavy, so that building the parsers (and so
``hetgmp --help``) does not import torch: the modules that own the behaviour import their
names from here, and ``tests/test_cli_help.py`` checks that the two agree.
"""

from __future__ import annotations

import argparse

MODEL_NAMES = ("dcn", "dfm", "dlrm", "wdl")  # hetgmp.models.MODELS' keys
REPLIES = ("stale", "all")  # hetgmp.embedding.DistributedEmbedding(replies=...)
EXCHANGES = ("exact", "padded")  # hetgmp.embedding.DistributedEmbedding(exchange=...)
# What --exchange padded needs, in one sentence that --help, the error and the README share
# (tests/test_frictions.py holds the README to it: they disagreed, issue 32).
PADDED_NEEDS = (
    "--replies all (or --replies auto, which resolves to all on NCCL) and --sync collective"
)
KERNELS = ("auto", "torch", "triton")  # hetgmp.embedding.kernels.resolve
DATA_ON_DEVICE = ("auto", "on", "off")  # hetgmp.data.pipeline
POOLINGS = ("sum", "mean")  # hetgmp.models.pooling (--pooling, issue 34)


def pooling_ok(text: str) -> bool:
    """``--pooling``: one of :data:`POOLINGS`, or a comma-separated one per multi-hot field."""
    return all(p in POOLINGS for p in text.split(","))


def parse_pooling(text: str, fields: int) -> tuple[str, ...]:
    """Each of ``fields`` multi-hot fields' pooling from ``--pooling`` (one mode: all of them)."""
    modes = tuple(text.split(","))
    return modes * fields if len(modes) == 1 else modes


def parse_embed_dim(text: str) -> int | tuple[int, ...]:
    """``--embed-dim``: one dimension (``16``) or one per field (``16,8,8``)."""
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a dimension or a comma-separated list of them (e.g. 16 or 16,8,8)"
        ) from None
    return dims[0] if len(dims) == 1 else dims
