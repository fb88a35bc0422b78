"""Cross-option checks of :class:`hetgmp.train.config.TrainConfig` (moved out of it, which
holds the options themselves): what ``--sync async`` does not support yet, and
``--embed-dim``'s per-field form."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hetgmp.choices import PADDED_NEEDS
from hetgmp.config import ConfigError


def check_sync(cfg: Any) -> None:
    """What ``--sync async`` does not support yet is refused here, by name."""
    if cfg.exchange == "padded" and (cfg.sync != "collective" or cfg.replies == "stale"):
        raise ConfigError(
            f"exchange: --exchange padded needs {PADDED_NEEDS}; got --replies "
            f"{cfg.replies} --sync {cfg.sync}"
        )
    if cfg.sync == "collective":
        for name, flag, default in (
            ("max_lag", "--max-lag", 0), ("dense_sync_every", "--dense-sync-every", 1),
            ("work_stealing", "--no-work-stealing", True),
        ):  # fmt: skip
            if getattr(cfg, name) != default:
                raise ConfigError(f"{name}: {flag} applies to --sync async only")
        return
    if not cfg.unequal_steps:
        return
    for name, flag, bad in (
        ("eval_every", "--eval-every", cfg.eval_every != 0),
        ("checkpoint_every", "--checkpoint-every", cfg.checkpoint_every != 0),
        ("resume", "--resume", cfg.resume),
    ):
        if bad:
            raise ConfigError(
                f"{name}: {flag} needs every rank at the same step; with --sync async and "
                f"--max-lag {cfg.max_lag} ranks run unequal step counts (evaluation and the "
                "checkpoint come at the end); use --max-lag 0 for it"
            )


def split_embed_dim(value: Any, field_dims: Any) -> tuple[Any, tuple[int, ...] | None]:
    """``(embed_dim, field_dims)`` of a config: ``embed_dim`` given as one number stays as it
    is; given per field (``"16,8"``, a sequence, or ``field_dims`` from a saved config) it
    becomes the largest (the table's width), the list goes to ``field_dims``. Bad values are
    left for :func:`hetgmp.config.validate` (or refused here, naming the option)."""
    if isinstance(value, str):
        value = _parse_dims(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        field_dims, value = value, None
    if field_dims is None:
        return value, None
    if isinstance(field_dims, str):
        field_dims = _parse_dims(field_dims)
    dims = tuple(field_dims) if isinstance(field_dims, Sequence) else (field_dims,)
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise ConfigError(f"embed_dim: expected one dimension per field (ints), got {value!r}")
    if min(dims) < 1:
        raise ConfigError(f"embed_dim: every field's dimension must be >= 1, got {list(dims)}")
    if value is not None and value != max(dims):  # (e.g. --config run.json --embed-dim 8)
        raise ConfigError(
            f"embed_dim: {value!r} is not the largest of the per-field dimensions "
            f"{list(dims)} (field_dims, from a saved config?); give --embed-dim as the list"
        )
    if len(dims) == 1:  # (one number: every field's)
        return dims[0], None
    return max(dims), dims


def _parse_dims(text: str) -> Any:
    try:
        dims = [int(d) for d in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"embed_dim: {text!r} is not a dimension or a comma-separated list of them "
            "(e.g. 16 or 16,8,8)"
        ) from None
    return dims[0] if len(dims) == 1 else dims


def dims_of_fields(dims: tuple[int, ...] | None, meta: Any) -> tuple[int, ...] | None:
    """Each field's dimension (``meta``'s single-hot fields, then its multi-hot ones) from
    ``--embed-dim``'s list, or None when every field has the table's: the count is checked,
    naming the fields. Equal dimensions give None, so such a run is today's run exactly."""
    if dims is None:
        return None
    names = [f.name for f in (*meta.fields, *meta.multi_hot)]
    if len(dims) != len(names):
        raise ConfigError(
            f"embed_dim: --embed-dim lists {len(dims)} dimensions but the data set has "
            f"{len(names)} fields ({', '.join(names)}: single-hot, then multi-hot); give one "
            "per field, or one number for all"
        )
    return None if len(set(dims)) == 1 else dims
