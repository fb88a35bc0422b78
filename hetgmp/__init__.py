"""hetgmp: train CTR models whose embedding tables are too big and too hot for one device.

Offline, :mod:`hetgmp.partition` places samples and embedding rows on workers so that each
worker mostly touches rows it owns; online, :mod:`hetgmp.embedding` keeps primary rows plus
mirrors of hot remote rows, synchronised under a bounded staleness.

The Python API -- ``hetgmp.distributed``, ``open_dataset``, ``make_plan``, ``build_model``,
``Trainer`` ... -- is :mod:`hetgmp.api`, importable from here (docs/python_api.md).
"""

__version__ = "0.1.0"

# The Python API (hetgmp/api.py, docs/python_api.md), imported on first use: `import hetgmp`
# stays light (no torch) for the CLI and for tools that only read version or data.
_API = (
    "Dataset", "DistEnv", "DistributedEmbedding", "EvalResult", "Plan", "Trainer",
    "build_model", "distributed", "generate_dataset", "init", "load_plan", "on_rank0",
    "make_plan", "open_dataset", "save_plan", "shutdown",
)  # fmt: skip
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> object:
    if name in _API:
        from hetgmp import api

        return getattr(api, name)
    raise AttributeError(f"module 'hetgmp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
