"""Load a serving artifact and score: ``hetgmp.serve.load(MODEL_DIR) -> Scorer``.

::

    scorer = hetgmp.serve.load("model/", device="cuda")
    p = scorer.score(ids, dense)              # global ids [B, F] int64, dense [B, num_dense]
    p = scorer.score_raw({"C1": ["68fd1e64", ...], ...}, raw_dense)   # through the vocabulary
    p = scorer.score(ids, dense, bags=[(values, offsets), ...])   # multi-hot fields' bags

A model with multi-hot fields (a version-2 artifact) takes each field's bags as ``(values,
offsets)`` (:mod:`hetgmp.serve.bags`), pooled as training pooled them; in ``score_raw`` a
multi-hot field's raw values are a list per sample.

Loading checks the manifest and every file's SHA-256; errors are
:class:`~hetgmp.serve.artifact.ArtifactError` naming the file. Nothing is unpickled: the dense
weights come from ``dense.safetensors`` into this hetgmp's model code; the exported program
``dense.pt2`` (a pickle: it can run code) is read only with ``trust_program=True``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from hetgmp.serve.artifact import (
    ROWS,
    VOCAB,
    ArtifactError,
    dense_file,
    multi_hot_fields,
    read_manifest,
    verify_files,
)
from hetgmp.serve.bags import BagFields, Bags, encode_raw_bags
from hetgmp.serve.compiled import MAX_BATCH, FastPath, build_fast_path
from hetgmp.serve.program import load_dense_weights, load_program
from hetgmp.serve.rows import CachedRows, DeviceRows, hot_order

ROW_PLACES = ("auto", "device", "host")
_AUTO_SHARE = 0.5  # rows="auto": the table goes on the GPU when it takes at most this share


class Scorer:
    """Scores samples with an exported model; see the module docstring."""

    def __init__(
        self,
        root: Path,
        manifest: dict[str, Any],
        program: Any,
        rows: Any,
        index: Any,
        fast: FastPath | None = None,
    ) -> None:
        self.root = root
        self.manifest = manifest
        self.program = program  # the dense part, eager (the exported program when trusted)
        self.rows = rows
        self.index = index  # global id -> table row (--min-count artifacts), or None
        self.fast = fast  # the compiled / CUDA-graph path, or None: the program, eager
        self.device = rows.device
        self.num_rows = int(manifest["num_rows"])
        self.num_fields = int(manifest["num_fields"])
        self.num_dense = int(manifest["num_dense"])
        self.bag_fields = BagFields.of(manifest)  # multi-hot fields (none: every field single)
        self._vocab: Any = None

    @property
    def vocabulary(self) -> Any:
        """The artifact's :class:`~hetgmp.data.vocab_store.Vocabulary` (error if it has none)."""
        if self._vocab is None:
            if not self.manifest.get("vocabulary"):
                raise ArtifactError(
                    f"{self.root / 'manifest.json'}: this artifact has no vocabulary (its data "
                    "set had none); score preprocessed ids with Scorer.score"
                )
            from hetgmp.data.vocab_store import Vocabulary

            self._vocab = Vocabulary.load(self.root)
        return self._vocab

    def _inputs(self, ids: Any, dense: Any) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(ids)
        if ids.dim() != 2 or ids.shape[1] != self.num_fields:
            raise ValueError(f"ids of shape {tuple(ids.shape)}, expected [B, {self.num_fields}]")
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ids must be int64 (or int32) global ids, got {ids.dtype}")
        ids = ids.to(self.device, torch.int64, non_blocking=True)
        b = ids.shape[0]
        if dense is None:
            if self.num_dense:
                raise ValueError(f"the model takes {self.num_dense} dense features; got none")
            dense = torch.zeros(b, 0)
        dense = torch.as_tensor(dense).to(self.device, torch.float32, non_blocking=True)
        if dense.shape != (b, self.num_dense):
            raise ValueError(
                f"dense of shape {tuple(dense.shape)}, expected [{b}, {self.num_dense}]"
            )
        return ids, dense

    def logits(
        self, ids: Any, dense: Any = None, *, bags: Bags | None = None, check: bool = True
    ) -> torch.Tensor:
        """Logits ``[B]`` (float32, on the scorer's device) of global ids ``[B, F]`` (and, for
        a model with multi-hot fields, their ``bags``: see :meth:`score`)."""
        ids, dense = self._inputs(ids, dense)
        checked = self.bag_fields.check(bags, ids.shape[0], self.device, check_ids=check)
        if check:
            self._check(ids)
        return self._forward(ids, dense, checked, probs=False)

    def score(
        self, ids: Any, dense: Any = None, *, bags: Bags | None = None, check: bool = True
    ) -> torch.Tensor:
        """Click probabilities ``[B]`` (float32, on the scorer's device) of global ids; a model
        with multi-hot fields also takes ``bags``, per field (in the manifest's order) a pair
        ``(values int64 [E], offsets int64 [B + 1])`` of global ids (:mod:`hetgmp.serve.bags`).
        ``check``: refuse ids outside their table (or field) ranges."""
        ids, dense = self._inputs(ids, dense)
        checked = self.bag_fields.check(bags, ids.shape[0], self.device, check_ids=check)
        if check:
            self._check(ids)
        return self._forward(ids, dense, checked, probs=True)

    @property
    def compiled(self) -> bool:
        """Whether the dense part runs compiled (``torch.compile``)."""
        return self.fast is not None and self.fast.compiled

    @property
    def cuda_graphs(self) -> bool:
        """Whether each batch bucket runs as one CUDA graph."""
        return self.fast is not None and self.fast.graphs

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """Compile (and capture) the buckets of these batch sizes now rather than on first use."""
        for b in batch_sizes:
            self.score(torch.zeros(int(b), self.num_fields, dtype=torch.int64),
                       torch.zeros(int(b), self.num_dense),
                       bags=self.bag_fields.empty(int(b)) or None)  # fmt: skip

    def _check(self, ids: torch.Tensor) -> None:
        bad = (ids < 0) | (ids >= self.num_rows)
        if bool(bad.any()):
            raise ValueError(
                f"id {ids[bad][0].item()} is outside the table's 0..{self.num_rows - 1}"
            )

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 rows ``[..., D]`` of global ids (through the ``--min-count`` index)."""
        return self.rows.lookup(ids if self.index is None else self.index[ids])

    def _forward(
        self, ids: torch.Tensor, dense: torch.Tensor, bags: list[Any], *, probs: bool
    ) -> torch.Tensor:
        if ids.shape[0] == 0:
            return torch.zeros(0, device=self.device)
        if self.fast is not None and self.fast.step.table is not None:
            return self.fast(ids, dense, probs=probs)  # gathers the rows itself
        with torch.inference_mode():
            rows = self._lookup(ids)
            if bags:  # (the fast path then takes rows: its step never gathers, see load)
                pooled = self.bag_fields.pooled(self._lookup, bags, ids.shape[0])
                rows = torch.cat([rows, pooled], dim=1)
            if self.fast is None:
                logits = self.program(rows, dense).reshape(-1)
        if self.fast is not None:
            return self.fast(rows, dense, probs=probs)
        # (outside inference mode: the caller gets an ordinary tensor, modifiable in place)
        return torch.sigmoid(logits) if probs else logits.clone()

    def encode_raw(
        self, categorical: Mapping[str, Sequence[Any]], dense: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(global ids [B, F], stored dense [B, num_dense]) of raw values by field name (missing:
        None or ""; raw dense: NaN = missing), exactly as preprocessing encodes them; a model
        with multi-hot fields takes their bags too (:meth:`encode_bags`)."""
        vocab = self.vocabulary
        absent = [n for n in vocab.field_names if n not in categorical]
        if absent:
            raise KeyError(f"raw values lack fields {absent}; fields: {vocab.field_names}")
        batch = len(categorical[vocab.field_names[0]])
        cols = [
            vocab.encode_values(n, categorical[n]) for n in vocab.field_names[: self.num_fields]
        ]
        ids = np.stack(cols, axis=1) if cols else np.zeros((batch, 0), np.int64)
        if dense is None:
            raw = np.full((ids.shape[0], self.num_dense), np.nan)
        else:
            raw = np.asarray(dense, dtype=np.float64).reshape(ids.shape[0], -1)
        return ids, vocab.transform_dense(raw)

    def encode_bags(
        self, categorical: Mapping[str, Sequence[Any]], batch: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The multi-hot fields' bags (``[]`` without any) of raw values by field name: a list
        of raw values per sample (:func:`~hetgmp.serve.bags.encode_raw_bags`)."""
        if not self.bag_fields.names:
            return []
        return encode_raw_bags(self.vocabulary, self.bag_fields.names, categorical, batch)

    def score_raw(
        self, categorical: Mapping[str, Sequence[Any]], dense: Any = None
    ) -> torch.Tensor:
        """Click probabilities of raw values (see :meth:`encode_raw`, :meth:`encode_bags`)."""
        ids, d = self.encode_raw(categorical, dense)
        bags = self.encode_bags(categorical, ids.shape[0])
        return self.score(ids, d, bags=bags or None, check=False)


def _read_rows(path: Path, want: list[int]) -> dict[str, torch.Tensor]:
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise ArtifactError(f"{path}: unreadable safetensors file ({err})") from err
    if "rows" not in tensors or tensors["rows"].dim() != 2:
        raise ArtifactError(f"{path}: holds no 2-D 'rows' tensor")
    if list(tensors["rows"].shape) != want:
        raise ArtifactError(
            f"{path}: rows of shape {list(tensors['rows'].shape)}, manifest says {want}"
        )
    return tensors


def _place_rows(
    tensors: dict[str, torch.Tensor],
    manifest: dict[str, Any],
    device: torch.device,
    rows: str,
    gpu_cache_rows: int | None,
) -> Any:
    table = tensors["rows"]
    if rows == "auto":
        rows = "device"
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            if table.numel() * table.element_size() > _AUTO_SHARE * free:
                rows = "host"
    if rows == "device" and gpu_cache_rows is None:
        return DeviceRows(table, device)
    if gpu_cache_rows is None:  # host rows, cache as large as the budget allows
        per_row = table.shape[1] * table.element_size() + 4
        budget = torch.cuda.mem_get_info(device)[0] * _AUTO_SHARE if device.type == "cuda" else 0
        gpu_cache_rows = int(budget // per_row)
    fields = [*manifest["fields"], *multi_hot_fields(manifest)]  # (bag values' rows too)
    order = hot_order(table.shape[0], fields, tensors.get("counts"), tensors.get("index"))
    return CachedRows(table, device, gpu_cache_rows, order)


def _dense_part(root: Path, manifest: dict[str, Any], dev: torch.device, trust: bool) -> Any:
    """The dense part on ``dev``: the model rebuilt around ``dense.safetensors``, or with
    ``trust`` the exported program (see :func:`load`)."""
    name = dense_file(root, manifest, trust_program=trust)
    if not trust:
        return load_dense_weights(root / name, manifest).to(dev)
    try:
        return load_program(root / name, dev)
    except Exception as err:  # noqa: BLE001 - any deserialisation failure means a bad file
        raise ArtifactError(f"{root / name}: cannot load the exported program ({err})") from err


def load(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    rows: str = "auto",
    *,
    gpu_cache_rows: int | None = None,
    verify: bool = True,
    compile: Any = "auto",
    cuda_graphs: Any = "auto",
    compile_mode: str | None = None,
    on_compile_error: str = "raise",
    max_batch: int = MAX_BATCH,
    warmup: Sequence[int] = (1,),
    amp: bool = False,
    trust_program: bool = False,
) -> Scorer:
    """Open a serving artifact made by ``hetgmp export``.

    ``rows``: ``device`` keeps the whole table on ``device``; ``host`` keeps it in (pinned) host
    memory with the ``gpu_cache_rows`` hottest rows cached on ``device`` (default: as many as
    half the free GPU memory holds); ``auto`` picks ``device`` when the table takes at most half
    the free memory. ``verify``: check every file's SHA-256 (sizes are always checked).

    The fast path (:mod:`hetgmp.serve.compiled`): ``compile`` (``"auto"``: on CUDA; off CUDA
    the model code uncompiled; ``False``: the dense part as loaded, uncompiled) runs the
    dense part under ``torch.compile`` (``compile_mode``),
    per power-of-two batch bucket up to ``max_batch``; ``cuda_graphs`` (``"auto"``: on CUDA with
    ``rows`` on the device) replays each bucket as one CUDA graph. If either cannot be built,
    ``on_compile_error="raise"`` raises :class:`~hetgmp.serve.compiled.CompileError`, ``"warn"``
    warns why and goes on without it. ``warmup``: batch sizes compiled at load, so that a
    failure shows here and first requests are not slow. ``amp``: the dense part under bf16
    autocast, as training's ``--amp`` evaluates (scores move by ~1e-3; float32 by default).

    ``trust_program``: by default the dense part is this hetgmp's model code, built from the
    manifest's config, with ``dense.safetensors``' weights (nothing is unpickled); ``True`` loads
    the exported program ``dense.pt2`` instead, which unpickles and so runs any code its maker
    put there: only for artifacts from a trusted source (or older ones, without safetensors)."""
    root = Path(model_dir)
    if rows not in ROW_PLACES:
        raise ValueError(f"rows={rows!r}: choose one of {', '.join(ROW_PLACES)}")
    dev = torch.device(device)
    manifest = read_manifest(root)
    verify_files(root, manifest, checksums=verify)
    tensors = _read_rows(root / ROWS, manifest["rows"]["shape"])
    program = _dense_part(root, manifest, dev, trust_program)
    store = _place_rows(tensors, manifest, dev, rows, gpu_cache_rows)
    if manifest.get("vocabulary") and not (root / VOCAB).is_dir():
        raise ArtifactError(f"{root / VOCAB}: missing from serving artifact {root}")
    index = tensors["index"].to(dev) if "index" in tensors else None
    # (multi-hot fields: the scorer gathers and pools, the fast path takes the rows)
    gathers = isinstance(store, DeviceRows) and not multi_hot_fields(manifest)
    fast = build_fast_path(
        program, manifest, store.table if gathers else None, index, dev,
        compile=compile, cuda_graphs=cuda_graphs, mode=compile_mode, max_batch=max_batch,
        on_error=on_compile_error, amp=amp,
    )  # fmt: skip
    scorer = Scorer(root, manifest, program, store, index, fast)
    if fast is not None:
        scorer.warmup(warmup)
    return scorer
