"""The options of the synthetic Criteo-like generator (``hetgmp generate criteo-like``) and
its error type.

In a module of their own, below both :mod:`hetgmp.data.generate` (the driver) and
:mod:`hetgmp.data.planted_model` (which draws the model from these options), so that neither
has to import the other for them. :mod:`hetgmp.data.generate` re-exports both names.
"""

from __future__ import annotations

import dataclasses

from hetgmp.config import option


class GenerateError(ValueError):
    """Invalid generator options."""


def parse_multi_hot(spec: str) -> tuple[int, int]:
    """``"K:L"`` -> (K fields, mean length L); ``""`` -> (0, 0). Raises ValueError."""
    if not spec:
        return 0, 0
    k, sep, length = spec.partition(":")
    if not sep or not k.strip().isdigit() or not length.strip().isdigit():
        raise ValueError(f"expected K:L (two whole numbers), got {spec!r}")
    if int(k) < 1 or int(k) > 64 or int(length) < 1 or int(length) > 10_000:
        raise ValueError(f"K in 1..64 and L in 1..10000, got {spec!r}")
    return int(k), int(length)


def _valid_multi_hot(spec: str) -> bool:
    try:
        parse_multi_hot(spec)
    except ValueError:
        return False
    return True


@dataclasses.dataclass
class CriteoLikeConfig:
    """Options of ``hetgmp generate criteo-like`` (defaults: a demo set made in seconds)."""

    num_samples: int = option(
        300_000, help="total samples (train + test)", check=lambda v: v >= 2, check_msg=">= 2"
    )
    scale: float = option(
        0.01,
        help="factor on the Criteo Kaggle field cardinalities (1.0 = 33.8M rows; min 2 per field)",
        check=lambda v: 0 < v <= 100,
        check_msg="in (0, 100]",
    )
    locality: float = option(
        0.8,
        help="probability that a field's id comes from the sample's user profile (0 none, 1 strong)",
        check=lambda v: 0 <= v <= 1,
        check_msg="in [0, 1]",
    )
    seed: int = option(0, help="random seed", check=lambda v: 0 <= v < 2**63, check_msg=">= 0")
    test_fraction: float = option(
        0.1, help="share of samples in the test split (the last ones)",
        check=lambda v: 0 < v < 1, check_msg="in (0, 1)",
    )  # fmt: skip
    positive_rate: float = option(
        0.25, help="target share of positive labels",
        check=lambda v: 0.001 <= v <= 0.999, check_msg="in [0.001, 0.999]",
    )  # fmt: skip
    samples_per_user: float = option(
        106.0, help="mean samples per latent user (movielens-100k: 106)",
        check=lambda v: v >= 1, check_msg=">= 1",
    )  # fmt: skip
    multi_hot: str = option(
        "", help="K:L: add K multi-hot fields (lists of ids drawn from the user's interests) of "
        "mean length L; empty: none (see hetgmp.data.planted_multi_hot)",
        check=_valid_multi_hot, check_msg="K:L with K in 1..64 and L in 1..10000, or empty",
    )  # fmt: skip
    communities: int = option(
        0, help="with --multi-hot: users form this many communities (user u in u mod C), each "
        "with its own item popularity, a power law over its own slice of the catalogue; a "
        "user's lists draw from their community's (what graph partitioning exploits); 0: every "
        "user draws from the catalogue's one global law, as before (hetgmp.data.planted_communities)",
        check=lambda v: 0 <= v <= 1_000_000, check_msg="in [0, 1000000]",
    )  # fmt: skip
    community_global: float = option(
        0.1, help="with --communities: share of list entries drawn from the catalogue's global "
        "power law instead (the items popular in every community)",
        check=lambda v: 0 <= v <= 1, check_msg="in [0, 1]",
    )  # fmt: skip
    chunk_size: int = option(
        32768, help="rows per generated chunk (does not change the output)",
        check=lambda v: v >= 1, check_msg=">= 1",
    )  # fmt: skip
    workers: int = option(
        0, help="generator threads (0 = number of CPUs, at most 4; does not change the output)",
        check=lambda v: v >= 0, check_msg=">= 0",
    )  # fmt: skip
    progress: bool = option(True, help="show a progress bar when stderr is a terminal")
    overwrite: bool = option(False, help="replace an existing output directory")
