"""The dense learning rate a run trains with (one rule for the CLI and the experiment sweeps)."""

from __future__ import annotations

ADAM_DEFAULT_LR = 1e-3


def resolve_dense_lr(lr: float, dense_optimizer: str, dense_lr: float | None) -> float:
    """``dense_lr`` if given, else 1e-3 for Adam and the sparse ``lr`` otherwise."""
    if dense_lr is not None:
        return dense_lr
    return ADAM_DEFAULT_LR if dense_optimizer == "adam" else lr
