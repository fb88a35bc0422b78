"""The distributed embedding table (owned + mirrored rows, bounded staleness) and its
single-process reference. Layout: docs/architecture.md."""

from hetgmp.choices import EXCHANGES, REPLIES
from hetgmp.counter_names import COUNTER_NAMES
from hetgmp.embedding.counters import format_counters
from hetgmp.embedding.errors import EmbeddingInputError, StalenessViolation
from hetgmp.embedding.init import initial_rows
from hetgmp.embedding.module import DistributedEmbedding, engine_of
from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.reference import ReferenceEmbedding

__all__ = [
    "COUNTER_NAMES",
    "EXCHANGES",
    "REPLIES",
    "DistributedEmbedding",
    "EmbeddingInputError",
    "ReferenceEmbedding",
    "SparseOptimizer",
    "StalenessViolation",
    "engine_of",
    "format_counters",
    "initial_rows",
]
