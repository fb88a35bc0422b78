"""The scorer's fast path: the scoring step compiled per batch bucket, one CUDA graph per bucket.

The dense part is this hetgmp's model code with the artifact's weights (``dense.safetensors``;
with ``trust_program`` it is rebuilt from the exported program's weights,
:func:`hetgmp.serve.program.rebuild_dense_program`, checked against the program, since Dynamo
cannot trace an exported program's module). Run as it is its dense layers are uncompiled
(unfused elementwise ops, one launch per op), so it is compiled with ``torch.compile``:

* batches are padded to a bucket, the next power of two up to ``max_batch`` (larger batches run
  in chunks of ``max_batch``), and each bucket is compiled with static shapes
  (``dynamic=False``): at most 17 compilations (1 .. 65536) whatever the request sizes, each with
  the kernels for its shape;
* with the table on the device, the compiled step is the whole scoring step: the ``--min-count``
  index, one gather of every field's rows (ids are global, so one kernel for all fields), the
  widening of bf16 / fp16 rows (fused with the gather), the dense part (with its first layer laid
  out for inference in float32: :mod:`hetgmp.serve.first_layer`) and the sigmoid;
* on CUDA each bucket is captured as one CUDA graph (one memory pool for all), replayed under a
  lock: inputs are copied into the graph's buffers and the result copied out;
* with rows in host memory the gather stays eager (a miss is a data-dependent host copy); the
  dense part is compiled, without graphs.

A bucket is compiled and captured on zero inputs before its first use, so a failure is the fast
path's, never the data's: it raises :class:`CompileError`, or with ``on_error="warn"`` warns
naming why and goes on without that part (eager layers, or no graphs), recorded in ``notes``.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch
from torch import nn

from hetgmp.serve.first_layer import inference_head
from hetgmp.serve.program import DenseProgram, rebuild_dense_program

MAX_BATCH = 65536
ON_ERROR = ("raise", "warn")
_RECOMPILE_LIMIT = 128  # every bucket is one more static-shape compilation of the same code


class CompileError(RuntimeError):
    """The scorer's fast path (compiled step or CUDA graph) could not be built."""


class ScoreStep(nn.Module):
    """``forward(x, dense) -> (logits [B], probabilities [B])``; ``x`` is global ids ``[B, F]``
    when ``table`` is given (the rows are gathered here), else gathered rows ``[B, F, D]``."""

    def __init__(
        self,
        dense: nn.Module,
        table: torch.Tensor | None,
        index: torch.Tensor | None,
        amp: bool = False,
    ) -> None:
        super().__init__()
        self.dense = dense
        self.table = table  # (plain attributes, not buffers: never saved nor moved)
        self.index = index
        self.amp = amp  # the dense part under bf16 autocast, as training's --amp

    def forward(self, x: torch.Tensor, dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.table is not None:
            if self.index is not None:
                x = self.index[x]
            x = self.table[x]
        if not self.amp:
            logits = self.dense(x.float(), dense).reshape(-1)
        else:  # (bf16 rows go in as they are; no autocast cache: casts stay inside a graph)
            with torch.autocast(x.device.type, dtype=torch.bfloat16, cache_enabled=False):
                logits = self.dense(x, dense).reshape(-1).float()
        return logits, torch.sigmoid(logits)


def bucket_of(batch: int, max_batch: int) -> int:
    """The bucket a batch of ``batch`` (<= ``max_batch``) samples runs in."""
    return min(max_batch, 1 << max(0, batch - 1).bit_length())


class _Graph:
    """One captured bucket: its input buffers and its outputs."""

    def __init__(self, graph: Any, x: torch.Tensor, dense: torch.Tensor, out: Any) -> None:
        self.graph, self.x, self.dense, self.out = graph, x, dense, out

    def replay(self, x: torch.Tensor, dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = x.shape[0]
        self.x[:b].copy_(x)  # rows past b keep an earlier call's valid inputs; sliced away
        self.dense[:b].copy_(dense)
        self.graph.replay()
        return self.out


class FastPath:
    """Runs a :class:`ScoreStep` per bucket, compiled and / or as CUDA graphs; see the module
    docstring. It runs under ``torch.inference_mode()``; what it returns is an ordinary tensor."""

    def __init__(
        self,
        step: ScoreStep,
        device: torch.device,
        *,
        compile: bool,
        graphs: bool,
        mode: str | None = None,
        max_batch: int = MAX_BATCH,
        on_error: str = "raise",
    ) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_compile_error={on_error!r}: choose one of {', '.join(ON_ERROR)}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if graphs and (device.type != "cuda" or step.table is None):
            raise ValueError("cuda_graphs needs a CUDA device with the rows on it (rows='device')")
        self.step, self.device, self.max_batch, self.on_error = step, device, max_batch, on_error
        self.compiled, self.graphs = compile, graphs
        self.notes: list[str] = []  # why a part was turned off (on_error="warn")
        self._fn: Any = torch.compile(step, dynamic=False, mode=mode) if compile else step
        self._ready: dict[int, _Graph | None] = {}
        self._pool = torch.cuda.graph_pool_handle() if graphs else None
        self._lock = threading.Lock()

    def __call__(self, x: torch.Tensor, dense: torch.Tensor, *, probs: bool) -> torch.Tensor:
        """Probabilities (``probs``) or logits ``[B]``, a new tensor of the caller's."""
        b, m = x.shape[0], self.max_batch
        if b > m:
            parts = [self(x[i : i + m], dense[i : i + m], probs=probs) for i in range(0, b, m)]
            return torch.cat(parts)
        if not (self.compiled or self.graphs):  # (eager: any shape, no bucket)
            with torch.inference_mode():
                out = self.step(x, dense)
            return out[1 if probs else 0].clone()
        size = bucket_of(b, m)
        with self._lock:
            with torch.inference_mode():
                if size not in self._ready:
                    self._ready[size] = self._prepare(size, x, dense)
                graph = self._ready[size]
                if graph is not None:
                    out = graph.replay(x, dense)
                else:  # (compiled in _prepare: no config patch per call, it costs ~40 us)
                    out = self._fn(_pad(x, size), _pad(dense, size))
            # a copy (the graph's buffers serve the next call), made outside inference mode so
            # that the caller may modify it in place
            return out[1 if probs else 0][:b].clone()

    def _prepare(self, size: int, x: torch.Tensor, dense: torch.Tensor) -> _Graph | None:
        """Compile bucket ``size`` on zero inputs, and capture it on CUDA."""
        sx = x.new_zeros((size, *x.shape[1:]))  # id 0 / zero rows: valid whatever the data
        sd = dense.new_zeros((size, *dense.shape[1:]))
        if self.compiled:
            try:
                self._warm(sx, sd)
            except Exception as err:  # noqa: BLE001 - any failure here is the compiler's
                self._give_up("compile", err)
        if not self.graphs:
            return None
        try:
            if not self.compiled:
                self._warm(sx, sd)  # (cuBLAS handles and workspaces exist before capture)
            return self._capture(sx, sd)
        except Exception as err:  # noqa: BLE001 - any failure here is the capture's
            self._give_up("cuda_graphs", err)
            return None

    def _warm(self, sx: torch.Tensor, sd: torch.Tensor) -> None:
        """Run the step on the buffers (compiling it), on a side stream when graphs follow."""
        with _recompiles():
            if not self.graphs:
                self._fn(sx, sd)
                return
            with torch.cuda.device(self.device):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        self._fn(sx, sd)
                torch.cuda.current_stream().wait_stream(side)

    def _capture(self, sx: torch.Tensor, sd: torch.Tensor) -> _Graph:
        with torch.cuda.device(self.device):
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            # thread_local: other threads of a server may use CUDA while a bucket is captured
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = self._fn(sx, sd)
        return _Graph(graph, sx, sd, out)

    def _give_up(self, part: str, err: Exception) -> None:
        lines = str(err).strip().splitlines()
        why = f"{part} failed: {type(err).__name__}: {lines[0] if lines else ''}"[:300]
        if self.on_error == "raise":
            raise CompileError(
                f"scorer fast path: {why}. Load with compile=False / cuda_graphs=False, or with "
                "on_compile_error='warn' to go on without it (slower)"
            ) from err
        warnings.warn(f"scorer fast path: {why}; going on without it (slower)", stacklevel=4)
        self.notes.append(why)
        if part == "compile":
            self.compiled, self._fn = False, self.step
        else:
            self.graphs = False


def _choice(name: str, value: Any, default: bool) -> bool:
    if value == "auto":
        return default
    if value is True or value is False:
        return value
    raise ValueError(f"{name}={value!r}: choose 'auto', True or False")


def build_fast_path(
    program: Any,
    manifest: dict[str, Any],
    table: torch.Tensor | None,
    index: torch.Tensor | None,
    device: torch.device,
    *,
    compile: Any = "auto",
    cuda_graphs: Any = "auto",
    mode: str | None = None,
    max_batch: int = MAX_BATCH,
    on_error: str = "raise",
    amp: bool = False,
) -> FastPath | None:
    """The fast path ``hetgmp.serve.load`` asks for, or None (the dense part as loaded, eager).

    ``table``: the rows when they are all on ``device`` (None: host rows, the gather stays
    eager). ``compile`` / ``cuda_graphs``: ``"auto"`` is on for CUDA (graphs: with the rows on
    the device); off CUDA ``compile="auto"`` runs the rebuilt model code uncompiled. ``mode``: ``torch.compile``'s; those with CUDA graphs of their own
    (``reduce-overhead``, ``max-autotune``) need ``cuda_graphs=False``. ``amp``: the dense
    part under bf16 autocast (as training's and evaluation's ``--amp``; scores move by ~1e-3)."""
    cuda = device.type == "cuda"
    want_compile = _choice("compile", compile, cuda)
    want_graphs = _choice("cuda_graphs", cuda_graphs, cuda and table is not None)
    if on_error not in ON_ERROR:
        raise ValueError(f"on_compile_error={on_error!r}: choose one of {', '.join(ON_ERROR)}")
    if want_graphs and mode in ("reduce-overhead", "max-autotune"):
        raise ValueError(
            f"compile_mode={mode!r} makes CUDA graphs of its own; the scorer captures its own "
            "(pass cuda_graphs=False to use compile's, or mode 'max-autotune-no-cudagraphs')"
        )
    # "auto" off CUDA: this hetgmp's model code with the program's weights, uncompiled (no
    # compilation wait per bucket, and none of the exported program's call overhead: 0.45 ms a
    # call, 3x plain PyTorch at batch 1 on a CPU); False runs the dense part as loaded
    eager_model = compile == "auto" and not cuda
    dense = program
    if want_compile or amp or eager_model:  # (autocast applies to the model code, not the program)
        rebuilt = _rebuild(program, manifest, amp, on_error if not eager_model else "warn")
        if rebuilt is None:
            want_compile = amp = eager_model = False
        else:
            dense = rebuilt
    if not (want_compile or want_graphs or amp or eager_model):
        return None
    step = ScoreStep(dense, table, index if table is not None else None, amp)
    return FastPath(
        step, device, compile=want_compile, graphs=want_graphs, mode=mode,
        max_batch=max_batch, on_error=on_error,
    )  # fmt: skip


def _rebuild(program: Any, manifest: dict[str, Any], amp: bool, on_error: str) -> Any:
    """The dense part as model code (in float32 with WDL's inference first layer): the loaded
    model itself, or rebuilt from a trusted program's weights; on failure with
    ``on_error="warn"`` None, after a warning."""
    try:
        # (the default load already built the model code from dense.safetensors)
        dense = (
            program
            if isinstance(program, DenseProgram)
            else rebuild_dense_program(program, manifest)
        )
    except Exception as err:  # noqa: BLE001 - whatever it is, compiling cannot go on
        why = f"cannot rebuild the dense part: {type(err).__name__}: {err}"
        if on_error == "raise":
            raise CompileError(
                f"scorer fast path: {why}. Load with compile=False (the dense part as loaded, "
                "uncompiled) or on_compile_error='warn'"
            ) from err
        warnings.warn(
            f"scorer fast path: {why}; the dense part runs as loaded, uncompiled (float32)",
            stacklevel=4,
        )
        return None
    _cache_field_columns(dense)
    # (under bf16 autocast the training layout was faster: hetgmp/serve/first_layer.py)
    return dense if amp else inference_head(dense)


def _cache_field_columns(dense: DenseProgram) -> None:
    """With a dimension per field, make the model's column indices and mask (cached by
    :class:`~hetgmp.models.field_dims.FieldDims` on first use) on its device now: else the first
    compiled call traces their making and the second recompiles (two compilations a bucket)."""
    fields = dense.model.fields
    if fields.dims is None:
        return
    device = next(dense.parameters()).device
    zeros = torch.zeros(1, fields.num_fields, fields.embed_dim, device=device)
    fields.flat(zeros)
    fields.masked(zeros)


def _recompiles() -> Any:
    """Room for one static-shape compilation per bucket (and per scorer in the process: they
    share the step's code), so Dynamo never falls back to running the step uncompiled."""
    cfg = torch._dynamo.config
    return cfg.patch(recompile_limit=max(_RECOMPILE_LIMIT, cfg.recompile_limit))


def _pad(t: torch.Tensor, size: int) -> torch.Tensor:
    """``t`` with zero rows appended up to ``size`` rows, as an inference tensor: a compiled
    step is guarded on its inputs' kind, and the buckets were compiled on inference tensors."""
    if t.shape[0] == size and t.is_inference():
        return t
    out = t.new_zeros((size, *t.shape[1:]))
    out[: t.shape[0]] = t
    return out
