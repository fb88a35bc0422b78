"""``TrainConfig``: every option of ``examples/hetuctr.py`` / ``hetgmp train``, typed and checked.

HET-GMP's spellings (``--batch_size``, ``--embed_dim``, ``--store_rate``, ``--log_every``,
``--eval_every``) are accepted next to the dashed ones, with HET-GMP's meaning.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

# (the choices from hetgmp.choices: the parsers, and so --help, must not import torch)
from hetgmp import choices
from hetgmp.choices import DATA_ON_DEVICE, EXCHANGES, KERNELS, MODEL_NAMES, PADDED_NEEDS, REPLIES
from hetgmp.config import ConfigError, option
from hetgmp.data.defaults import DEFAULT_CACHE, DEFAULT_DATASET_NAME, DEFAULT_SAMPLES
from hetgmp.train.config_checks import check_sync, split_embed_dim
from hetgmp.train.dense_lr import resolve_dense_lr
from hetgmp.train.straggle import straggle_ok

SPARSE_OPTIMIZERS = ("sgd", "adagrad")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
DEFAULT_DATASET = DEFAULT_DATASET_NAME


def _positive(v: int | float) -> bool:
    return v > 0


def _non_negative(v: int | float) -> bool:
    return v >= 0


@dataclasses.dataclass
class TrainConfig:
    """Resolved options of one training run (printed at start, saved in every checkpoint/log)."""

    dataset: str = option(
        DEFAULT_DATASET,
        help="dataset directory, or the name of a prepared one under --cache-dir/datasets; the "
        f"default {DEFAULT_DATASET!r} is generated there on first use",
    )
    model: str = option("wdl", help="CTR model", choices=MODEL_NAMES)
    val: bool = option(
        True, help="evaluate on the test split every --eval_every steps and at the end"
    )
    bound: int = option(
        0,
        help="staleness bound for mirrors (0 = synchronous)",
        check=_non_negative,
        check_msg="must be >= 0",
    )
    batch_size: int = option(
        1024,
        help="samples per rank per step",
        check=_positive,
        check_msg="must be >= 1",
        flags=["--batch-size", "--batch_size"],
    )
    embed_dim: int = option(
        16, check=_positive, check_msg="must be >= 1", parse=choices.parse_embed_dim,
        flags=["--embed-dim", "--embed_dim"], help="embedding dimension: one for every field, "
        "or one per field comma separated (single-hot fields, then multi-hot ones; the table "
        "stores the largest, each field uses its first d columns: docs/architecture.md)",
    )  # fmt: skip
    field_dims: tuple[int, ...] | None = option(
        None, parse=choices.parse_embed_dim, flags=["--field-dims"], help="each field's "
        "dimension, as --embed-dim's list sets it and a saved config records it (then "
        "--embed-dim is their largest); give --embed-dim instead",
    )  # fmt: skip
    iter: int = option(
        0,
        help="stop after this many global steps in total (0: run --epochs)",
        check=_non_negative,
        check_msg="must be >= 0",
        flags=["--iter", "--iters"],
    )
    epochs: int = option(
        1, help="epochs over the training split", check=_positive, check_msg="must be >= 1"
    )
    log_every: int = option(
        100,
        help="steps between TRAIN log lines",
        check=_positive,
        check_msg="must be >= 1",
        flags=["--log-every", "--log_every"],
    )
    eval_every: int = option(
        0,
        help="steps between evaluations (0: only at the end)",
        check=_non_negative,
        check_msg="must be >= 0",
        flags=["--eval-every", "--eval_every"],
    )
    store_rate: float = option(
        0.0,
        help="share of all rows each rank mirrors, in the plan's priority order (without "
        "--partition: random owners, each rank's most used rows, as HET-GMP)",
        check=lambda v: 0.0 <= v <= 1.0,
        check_msg="must lie in [0, 1]",
        flags=["--store-rate", "--store_rate"],
    )
    partition: Path | None = option(None, help="plan file (part.npz); omitted: hash placement")
    pooling: str = option(
        "sum", check=choices.pooling_ok, check_msg="must be sum or mean, or one per multi-hot "
        "field comma separated (e.g. sum,mean)", help="how a multi-hot field's bag of rows "
        "becomes one row: their sum or their mean (an empty bag: zeros); one mode for every "
        "field, or one per field comma separated (issue 34: CPU, and one GPU so far)",
    )  # fmt: skip
    rows_on: str = option(
        "device", choices=("device", "host"), flags=["--rows-on"],
        help="where a rank's (owned) rows and optimizer state live: on the device, or in (pinned) "
        "host memory with a device cache of --cache-budget of them, each batch's missed rows "
        "read in by the GPU as it trains (one rank: inside the step's CUDA graph; several "
        "ranks: the exact exchange and, on CUDA, --no-cuda-graphs so far)",
    )  # fmt: skip
    cache_budget: float = option(
        0.25, check=lambda v: 0.0 < v <= 1.0, check_msg="must lie in (0, 1]",
        flags=["--cache-budget"], help="with --rows-on host: the cached share of the rows",
    )  # fmt: skip
    cache_warm: str = option(
        "counts", choices=("counts", "cold"), flags=["--cache-warm"], help="with --rows-on host: "
        "the cache starts with each rank's most used rows (the training split's id counts, one "
        "pass over its ids) or cold (the lowest ids; residency then adapts)",
    )  # fmt: skip
    output: Path | None = option(
        None,
        help="write the final results (metrics, speed, config) as JSON here (HET-GMP "
        "wrote its TRAIN / EVAL lines there: here they go to stdout, and --log-json writes "
        "them as JSON lines)",
    )
    lr: float = option(
        0.05, check=_positive, check_msg="must be > 0",
        help="learning rate of the sparse (embedding) optimizer (row-wise Adagrad: 0.05-0.1)",
    )  # fmt: skip
    dense_lr: float | None = option(
        None, check=_positive, check_msg="must be > 0",
        help="learning rate of the dense optimizer (default: 1e-3 for adam, else --lr)",
    )  # fmt: skip
    # Defaults measured in bench/bench_quality.py: row-wise Adagrad for the rows, Adam for the MLPs.
    optimizer: str = option("adagrad", help="sparse optimizer", choices=SPARSE_OPTIMIZERS)
    dense_optimizer: str = option("adam", help="dense optimizer", choices=DENSE_OPTIMIZERS)
    init_scale: float = option(
        0.01,
        help="embedding rows start uniform in [-s, s]",
        check=_positive,
        check_msg="must be > 0",
    )
    adagrad_init: float = option(
        1e-7,
        help="initial row-wise Adagrad accumulator. With 0 a row's first update is a full --lr "
        "step whatever its gradient, so a row seen once moves as far as a hot one; the floor damps "
        "rows with small (few-occurrence) gradients (units: squared gradient of the loss averaged "
        "over the global batch; measured in bench/bench_quality.py)",
        check=_non_negative,
        check_msg="must be >= 0",
    )
    seed: int = option(0, help="seed for parameters and shuffling")
    shuffle: bool = option(True, help="shuffle each rank's samples every epoch (by seed, epoch)")
    device: str = option(
        "auto",
        help="device of each rank (auto: one GPU per rank if available)",
        choices=["auto", "cpu", "cuda"],
    )
    backend: str = option(
        "auto",
        help="torch.distributed backend (auto: nccl on cuda, gloo on cpu; gloo also moves "
        "CUDA tensors, so several ranks can share one GPU, e.g. for tests)",
        choices=["auto", "gloo", "nccl"],
    )
    amp: bool | None = option(
        None,
        help="bf16 autocast for the dense part (and the embedding rows it reads); default: on "
        "with CUDA (faster, AUC unchanged in bench/gpu/train_gpu.sh), off on CPU",
    )
    cuda_graphs: bool = option(
        True,
        help="replay the whole training step as one CUDA graph where it applies (CUDA, "
        "--dense-optimizer adam or sgd; several ranks: the padded exchange, samples resident "
        "on the device; full batches, after a few eager steps)",
    )
    matmul_precision: str = option(
        "high",
        help="float32 matrix products on CUDA: highest (full fp32), high (TF32 tensor cores: "
        "the dense MLP several times faster, AUC unchanged in bench/gpu/train_gpu.sh) or medium "
        "(bf16 internally); no effect on CPU",
        choices=["highest", "high", "medium"],
    )
    replies: str = option(
        "auto",
        help="owners answer mirror queries with values for the stale ones only (stale: fewest "
        "bytes, two host syncs per step) or for all (all: more bytes, one sync; for NVLink); "
        "auto: all on NCCL, stale otherwise",
        choices=["auto", *REPLIES],
    )
    kernels: str = option(
        "auto",
        help="Triton kernels for the embedding row updates and DCN's cross network (auto: "
        "Triton on CUDA, torch otherwise)",
        choices=list(KERNELS),
    )
    exchange: str = option(
        "auto",
        help="multi-rank embedding payloads: exact (sized per step) or padded (fixed capacities, "
        "so a step replays as CUDA graphs, with several ranks on CUDA the whole step as one; "
        f"needs {PADDED_NEEDS}); auto: padded where it applies on CUDA (with --rows-on host "
        "where the whole step is one graph: samples resident, --cuda-graphs)",
        choices=["auto", *EXCHANGES],
    )
    sync: str = option(
        "collective",
        help="how ranks keep the embedding in sync: collective (every step one exchange among "
        "all ranks, in lockstep) or async (each rank serves its owned rows from a ZeroMQ "
        "thread, the others read and push point to point, no global barrier; CPU or CUDA "
        "ranks; with --max-lag != 0 a slow rank no longer holds the others up; needs pyzmq, "
        "the async extra)",
        choices=["collective", "async"],
    )
    max_lag: int = option(
        0,
        help="--sync async: steps a rank may run ahead of the slowest (stale synchronous "
        "parallel; -1: unbounded). 0 keeps every rank at the same step (with --bound 0 it "
        "trains as --sync collective); otherwise ranks run unequal step counts and training "
        "ends on a global sample budget (--epochs x training samples, or --iter x ranks x "
        "--batch-size), fast ranks doing more steps. A persistent straggler caps the lead at "
        "--max-lag steps: then the others wait for it again",
        check=lambda v: v >= -1,
        check_msg="must be >= 0, or -1 for unbounded",
        flags=["--max-lag", "--max_lag"],
    )
    work_stealing: bool = option(
        True,
        help="--sync async with --max-lag != 0: a rank that has taken every batch of its shard "
        "for the epoch takes the unclaimed batches of slower ranks (claimed through their "
        "services), so each epoch trains every sample once however unequal the ranks' speeds; "
        "--no-work-stealing: each rank cycles its own shard (a slow rank's samples are trained "
        "less often)",
    )
    async_host: str = option(
        "auto",
        help="--sync async: address each rank's row service listens on (auto: 127.0.0.1 when "
        "every rank runs on one host, else the interface this host uses for outbound "
        "traffic); published to the peers at start through the launch",
        flags=["--async-host"],
    )
    async_auth: str = option(
        "auto",
        help="--sync async: who may talk to the ranks' services (auto: on loopback this host's "
        "processes, beyond it only the job's ranks, by ZeroMQ CURVE keys made at launch; "
        "curve: CURVE even on loopback; insecure: no CURVE even across hosts, so anyone "
        "reaching the ports can read rows and push gradients: for private networks only)",
        choices=("auto", "curve", "insecure"),
        flags=["--async-auth"],
    )
    async_port_base: int = option(
        0,
        help="--sync async: rank r listens on this port + r (0: a free port the OS picks)",
        check=lambda v: 0 <= v <= 65535,
        check_msg="must lie in [0, 65535]",
        flags=["--async-port-base"],
    )
    dense_sync_every: int = option(
        1,
        help="--sync async: exchange the dense parameters every this many steps. With --max-lag "
        "0: 1 sums the dense gradients every step, as --sync collective; k > 1 averages the "
        "parameters over ranks every k steps (each rank steps on its own gradients in "
        "between). With --max-lag != 0: each rank pushes its change every k steps to a dense "
        "parameter server spread over the ranks' services and pulls the current value, "
        "without meeting the others",
        check=_positive,
        check_msg="must be >= 1",
        flags=["--dense-sync-every"],
    )
    straggle: str = option(
        "",
        help="benchmark facility: RANK:FACTOR makes rank RANK a straggler, waiting (FACTOR-1) x "
        "its own measured step time after each step (RANK:FACTOR:spin keeps its core busy "
        "instead of sleeping); either --sync mode",
        check=straggle_ok,
        check_msg="must be RANK:FACTOR or RANK:FACTOR:spin with RANK >= 0 and FACTOR >= 1 "
        "(e.g. 1:2)",
        flags=["--straggle"],
    )
    eval_batch_size: int = option(
        4096, help="samples per rank per evaluation step", check=_positive, check_msg="must be >= 1"
    )
    warmup_steps: int = option(
        10, help="first steps timed separately (warm-up) from the throughput",
        check=_non_negative, check_msg="must be >= 0",
    )  # fmt: skip
    data_on_device: str = option(
        "auto",
        help="hold this rank's training samples in device memory, each batch an index_select "
        "there (auto: on CUDA when they fit --device-data-budget-gb; on: also on CPU, in RAM)",
        choices=list(DATA_ON_DEVICE),
    )
    device_data_budget_gb: float = option(
        0.0,
        help="device memory (GiB) resident samples may take under --data-on-device auto (0: a "
        "quarter of the device's free memory)",
        check=_non_negative,
        check_msg="must be >= 0",
    )
    prefetch_batches: int = option(
        4,
        help="when the samples are not on the device: batches a background thread gathers ahead "
        "(into pinned buffers, copied on a side stream on CUDA); 0: gather in the training thread",
        check=_non_negative,
        check_msg="must be >= 0",
    )
    profile_steps: int = option(
        0,
        help="time the phases of this many steps after warm-up (CUDA events; results step_ms)",
        check=_non_negative,
        check_msg="must be >= 0",
    )
    checkpoint_dir: Path | None = option(None, help="directory for checkpoints")
    checkpoint_every: int = option(
        0,
        help="steps between checkpoints (0: only at the end)",
        check=_non_negative,
        check_msg="must be >= 0",
    )
    resume: bool = option(False, help="continue from the latest checkpoint in --checkpoint-dir")
    init_from: Path | None = option(
        None,
        help="start from this checkpoint's rows, dense weights and optimizer states (any rank "
        "count or plan; data encoded with its vocabulary, grown or not: docs/daily.md), at "
        "step 0 of this data; with --resume, a checkpoint in --checkpoint-dir wins",
        flags=["--init-from"],
    )
    log_json: Path | None = option(None, help="JSON-lines log file (rank 0 writes it)")
    progress: bool | None = option(
        None,
        help="progress bar on rank 0; by default only when stderr is a terminal and no launcher "
        "(mpirun, srun, torchrun: their ranks get a pty even when the output goes to a file) "
        "started the run; --progress forces it, --no-progress turns it off",
    )
    cache_dir: Path = option(DEFAULT_CACHE, help="where named/generated data sets live")
    default_samples: int = option(
        DEFAULT_SAMPLES,
        help="training samples of the generated default data set",
        check=_positive,
        check_msg="must be >= 1",
    )
    timeout_s: float = option(
        300.0,
        help="seconds a collective may wait before failing",
        check=_positive,
        check_msg="must be > 0",
        flags=["--timeout-s", "--timeout_s", "--timeout"],
    )
    threads: int = option(
        0,
        help="torch CPU threads per rank (0: each rank's share of the cores the load average "
        "leaves free, at least 1; the log says what was picked)",
        check=_non_negative,
        check_msg="must be >= 0",
    )
    keep_checkpoints: int = option(
        2, help="how many recent checkpoints to keep", check=_positive, check_msg="must be >= 1"
    )
    debug: bool = option(False, help="show full tracebacks on errors")

    def __post_init__(self) -> None:
        # --embed-dim 16,8,...: embed_dim becomes the table's width (the largest), field_dims
        # each field's own (hetgmp.train.config_checks.split_embed_dim)
        self.embed_dim, self.field_dims = split_embed_dim(self.embed_dim, self.field_dims)

    def check(self) -> None:
        """Cross-option checks (called by :func:`hetgmp.config.validate`)."""
        if self.resume and self.checkpoint_dir is None:
            raise ConfigError("resume: --resume needs --checkpoint-dir")
        if self.checkpoint_every and self.checkpoint_dir is None:
            raise ConfigError("checkpoint_every: --checkpoint-every needs --checkpoint-dir")
        check_sync(self)

    @property
    def unequal_steps(self) -> bool:
        """``--sync async`` with ``--max-lag`` != 0: ranks run unequal step counts until a
        global sample budget (:mod:`hetgmp.train.async_loop`)."""
        return self.sync == "async" and self.max_lag != 0

    @property
    def effective_dense_lr(self) -> float:
        return resolve_dense_lr(self.lr, self.dense_optimizer, self.dense_lr)
