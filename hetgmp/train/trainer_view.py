"""What the trainer's helpers use of a :class:`~hetgmp.train.trainer.Trainer`, as a protocol.

The helpers -- the results (:mod:`.report`), checkpoint save and restore (:mod:`.resume`), the
TRAIN lines (:mod:`.train_lines`) and the unequal-steps loop of ``--sync async``
(:mod:`.async_loop`) -- are called by the trainer
and handed the trainer itself. Naming the class for their annotations would make each of them
import :mod:`.trainer`, which imports them: an import cycle, even when only for type checking.
They name this view instead; ``tests/test_trainer_view.py`` checks that the trainer has every
member it lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from hetgmp.comm.env import DistEnv
    from hetgmp.data.device_batches import EpochPlan, Slot
    from hetgmp.data.format import Dataset
    from hetgmp.data.pipeline import BatchSource
    from hetgmp.models import CTRModel
    from hetgmp.train.accounting import TrainClock
    from hetgmp.train.checkpoint import Position
    from hetgmp.train.config import TrainConfig
    from hetgmp.train.evaluate import EvalResult
    from hetgmp.train.graphed import GraphedStep
    from hetgmp.train.graphed_multi import MultiRankGraphedStep
    from hetgmp.train.profile import PhaseProfiler
    from hetgmp.train.runlog import RunLog
    from hetgmp.train.step import TrainStep
    from hetgmp.train.straggle import Straggler


class TrainerView(Protocol):
    """The trainer's members its helpers read (and the few they set: ``position``,
    ``samples_seen``, ``samples_before``, ``extra_results``, ``counters_at_line``); see the
    trainer for each."""

    cfg: TrainConfig
    env: DistEnv
    dataset: Dataset
    model: CTRModel
    log: RunLog
    indices: np.ndarray
    indices_of: Callable[[int], np.ndarray] | None
    info: dict[str, Any]
    amp: bool
    train_step: TrainStep
    run_step: TrainStep | GraphedStep | MultiRankGraphedStep
    dense_params: list[nn.Parameter]
    dense_opt: torch.optim.Optimizer
    position: Position
    counts: list[int]
    steps_per_epoch: int
    total_steps: int
    counters_at_line: dict[str, float]
    last_eval: EvalResult | None
    clock: TrainClock
    profiler: PhaseProfiler
    data_source: str
    eval_counters: dict[str, float]
    samples_seen: int
    samples_before: int
    straggler: Straggler
    extra_results: dict[str, Any]

    @property
    def samples_total(self) -> int: ...

    def step_graph(self) -> str: ...

    def open_source(self, plan: EpochPlan, slots: Iterator[Slot]) -> BatchSource: ...
