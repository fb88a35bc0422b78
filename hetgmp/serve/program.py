"""The dense part of a CTR model as a standalone module over gathered rows, and its exports.

A training model looks its rows up through a (distributed) embedding whose lookup has
data-dependent steps (``.item()``, unique, exchanges), which ``torch.export`` cannot trace. Serving
gathers the rows itself (:mod:`hetgmp.serve.scorer`), so the exported program takes the rows
``[B, F, D]`` (with multi-hot fields ``[B, F + K, D]``: one pooled row per bag field after the
single-hot rows, pooled by the scorer, :mod:`hetgmp.serve.bags`) and the dense features
``[B, num_dense]`` and holds only the dense layers: the model with its embedding replaced by the
identity on rows. With a dimension per field (``field_dims``) the rows stay ``D`` wide and the
program keeps each field's first ``d_f`` columns, as training's model does
(:mod:`hetgmp.models.field_dims`). Nothing in it depends on data values, and the batch dimension
is dynamic.

What an artifact is trusted to do: its dense weights (``dense.safetensors``, plain tensors) are
read without unpickling and put into this hetgmp's model code, rebuilt from the manifest's
config (:func:`load_dense_weights`); the exported program (``dense.pt2``) is unpickled by
``torch.export.load``, which can run code, so :func:`load_program` is only reached with an
explicit ``trust_program=True`` (``--trust-program``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from hetgmp.models import CTRModel, build_model
from hetgmp.serve.artifact import ArtifactError, field_dims, model_fields


class RowsIdentity(nn.Module):
    """An "embedding" whose input already is the rows: ``forward(rows [B, F, D]) -> rows``."""

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return rows


class DenseProgram(nn.Module):
    """``forward(rows [B, F, D] float32, dense [B, num_dense] float32) -> logits [B, 1]``."""

    def __init__(self, model: CTRModel) -> None:
        super().__init__()
        if not isinstance(model.embedding, RowsIdentity):
            raise TypeError("DenseProgram needs a model built around RowsIdentity")
        self.model = model
        self.num_dense = model.num_dense

    def forward(self, rows: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.model(rows, dense if self.num_dense else None)


def build_dense_program(
    model: str,
    state: dict[str, torch.Tensor],
    *,
    num_fields: int,
    num_dense: int,
    embed_dim: int,
    dims: Sequence[int] | None = None,
) -> DenseProgram:
    """The model ``model`` with the checkpoint's dense ``state``, over gathered rows (eval mode);
    ``dims``: each field's dimension (the checkpoint's ``field_dims``; None: all ``embed_dim``)."""
    net = build_model(
        model, RowsIdentity(), num_fields=num_fields, num_dense=num_dense, embed_dim=embed_dim,
        field_dims=dims,
    )  # fmt: skip
    net.load_dense_state_dict(state)
    return DenseProgram(net).eval()


def example_inputs(
    batch: int, num_fields: int, table_dim: int, num_dense: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs of the program's shapes (for tracing and for benchmarks)."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(batch, num_fields, table_dim, generator=g) * 0.01
    return rows, torch.rand(batch, num_dense, generator=g)


def export_program(program: DenseProgram, path: Path, table_dim: int) -> dict[str, Any]:
    """``torch.export`` the program with a dynamic batch and save it as ``.pt2``."""
    f, nd = program.model.num_fields, program.num_dense
    batch = torch.export.Dim("batch", min=1, max=1 << 24)
    ep = torch.export.export(
        program,
        example_inputs(8, f, table_dim, nd),
        dynamic_shapes={"rows": {0: batch}, "dense": {0: batch}},
    )
    torch.export.save(ep, str(path))
    return {
        "file": path.name,
        "inputs": {
            "rows": ["batch", f, table_dim, "float32"],
            "dense": ["batch", nd, "float32"],
        },
        "output": {"logits": ["batch", 1, "float32"]},
        "torch": torch.__version__,
    }


def export_onnx(program: DenseProgram, path: Path, table_dim: int) -> dict[str, Any]:
    """The same module through ``torch.onnx.export`` when onnx is installed; else a note."""
    try:
        import onnx  # noqa: F401  (optional: only to know whether the exporter can run)
    except ImportError:
        return {"file": None, "note": "onnx is not installed (pip install onnx onnxscript)"}
    f, nd = program.model.num_fields, program.num_dense
    try:
        torch.onnx.export(
            program,
            example_inputs(8, f, table_dim, nd),
            str(path),
            input_names=["rows", "dense"],
            output_names=["logits"],
            dynamic_axes={"rows": {0: "batch"}, "dense": {0: "batch"}, "logits": {0: "batch"}},
        )
    except Exception as err:  # noqa: BLE001 - ONNX is optional; say why it is absent
        path.unlink(missing_ok=True)
        return {"file": None, "note": f"torch.onnx.export failed: {type(err).__name__}: {err}"}
    return {"file": path.name, "note": "same inputs and output as the torch.export program"}


def rebuild_dense_program(program: Any, manifest: dict[str, Any]) -> DenseProgram:
    """The exported ``program`` (as :func:`load_program` returns it) rebuilt as a
    :class:`DenseProgram` of this hetgmp's model code with the program's weights, on the
    program's device, so that ``torch.compile`` can take it (Dynamo does not trace an exported
    program's module). Raises ``ValueError`` when the weights do not fit the model or the two
    disagree on example inputs (the artifact was made by a hetgmp whose model code differs)."""
    # the model's weights are under "model."; constants made while tracing are not weights
    state = {
        k.removeprefix("model."): v.detach()
        for k, v in program.state_dict().items()
        if k.startswith("model.")
    }
    device = next(iter(state.values())).device
    dense = build_dense_program(
        manifest["model"],
        {k: v.cpu() for k, v in state.items()},
        num_fields=model_fields(manifest),
        num_dense=int(manifest["num_dense"]),
        embed_dim=int(manifest["embed_dim"]),
        dims=field_dims(manifest),
    ).to(device)
    rows, extra = example_inputs(
        8, dense.model.num_fields, int(manifest["table_dim"]), dense.num_dense
    )
    rows, extra = rows.to(device), extra.to(device)
    with torch.inference_mode():
        want, got = program(rows, extra), dense(rows, extra)
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
        diff = float((got - want).abs().max())
        raise ValueError(
            f"the rebuilt {manifest['model']} differs from the exported program by {diff:.3g} "
            "on example inputs (the artifact was exported by another hetgmp version)"
        )
    return dense


def save_dense_weights(program: DenseProgram, path: Path) -> dict[str, Any]:
    """The dense weights as safetensors (plain tensors: loading them runs no code); returns the
    manifest entry. The model is rebuilt from the manifest's config on load."""
    state = {k: v.detach().cpu().contiguous() for k, v in program.model.dense_state_dict().items()}
    save_file(state, str(path), metadata={"format": "hetgmp-serving-dense"})
    return {"file": path.name, "tensors": len(state), "format": "safetensors"}


def load_dense_weights(path: Path, manifest: dict[str, Any]) -> DenseProgram:
    """The model the manifest names (``model``, ``num_fields`` and its multi-hot fields'
    pooled rows, ``num_dense``, ``embed_dim``, ``field_dims``),
    built by this hetgmp's code, with the weights of ``path``: nothing is unpickled, and a file
    that is not safetensors, or whose tensors do not fit the model, is an
    :class:`~hetgmp.serve.artifact.ArtifactError` naming it."""
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise ArtifactError(f"{path}: unreadable safetensors file ({err})") from err
    try:
        return build_dense_program(
            str(manifest["model"]),
            state,
            num_fields=model_fields(manifest),
            num_dense=int(manifest["num_dense"]),
            embed_dim=int(manifest["embed_dim"]),
            dims=field_dims(manifest),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise ArtifactError(
            f"{path}: the weights do not fit the manifest's model {manifest.get('model')!r} ({err})"
        ) from err


def load_program(path: Path, device: torch.device | str = "cpu") -> Any:
    """Unpickles: only for an artifact whose maker is trusted (``trust_program=True``).

    The saved program as a callable module on ``device`` (constants made during tracing,
    such as DLRM's interaction indices, move with it)."""
    ep = torch.export.load(str(path))
    if torch.device(device).type != "cpu":
        from torch.export.passes import move_to_device_pass

        ep = move_to_device_pass(ep, torch.device(device))
    return ep.module()
