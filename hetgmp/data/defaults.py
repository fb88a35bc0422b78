"""The embedded default data set shared by every entry point.

``hetgmp partition`` without ``--data``, ``hetgmp train`` without ``--dataset`` and ``make demo``
all use the same generated criteo-like set, made once under ``~/.cache/hetgmp/datasets`` — so a
plan made by ``python partition/partition.py -n 8 -o part.npz`` fits the data that
``mpirun -np 8 python examples/hetuctr.py --partition part.npz`` trains on.
"""

from __future__ import annotations

from pathlib import Path

from hetgmp.data.format import Dataset, open_dataset

DEFAULT_CACHE = Path.home() / ".cache" / "hetgmp"
DEFAULT_DATASET_NAME = "criteo-like-default"
DEFAULT_SAMPLES = 200_000
DEFAULT_SEED = 0


def default_dataset_dir(cache_dir: Path | None = None, num_samples: int = DEFAULT_SAMPLES) -> Path:
    """Where the default data set (of ``num_samples`` samples) lives."""
    name = DEFAULT_DATASET_NAME if num_samples == DEFAULT_SAMPLES else f"criteo-like-{num_samples}"
    return (cache_dir or DEFAULT_CACHE) / "datasets" / name


def ensure_default_dataset(
    cache_dir: Path | None = None, num_samples: int = DEFAULT_SAMPLES, *, progress: bool = True
) -> Dataset:
    """Open the default data set, generating it first if it is not there yet."""
    from hetgmp.data.generate import GENERATOR_VERSION, generate_criteo_like

    out = default_dataset_dir(cache_dir, num_samples)
    if (out / "meta.json").exists():
        ds = open_dataset(out)
        # A set cached by an older generator is regenerated, so the default stays what this
        # version documents (plans made for the old set then fail their fingerprint check).
        if ds.meta.source.get("generator_version") == GENERATOR_VERSION:
            return ds

    return generate_criteo_like(
        out, num_samples=num_samples, seed=DEFAULT_SEED, progress=progress, overwrite=True
    )
