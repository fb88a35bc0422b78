"""The rows stored here take a batch's gradient at the end of its own step when the next
batch's rows were read ahead (:mod:`.ahead`), and the next step reads them from the table.

Why: reading one step ahead answered step ``t + 1``'s rows while step ``t`` computed, before
step ``t``'s gradient was applied anywhere, so every row, the hot rows owned here included,
was read one step late: on 2 H100s the user's command then trained worse (val AUC 0.7721 vs
0.7771 at batch 65536, 2026-11-26), while the same lag on mirrors alone is what ``--bound``
allows anyway. HET-GMP's write rule applies a worker's gradient to the rows it stores at
once; so here, at the end of the step (its backward has summed the gradient per row and the
side stream's exchange has joined):

* own rows take the optimizer's step with this rank's gradient and mirrors their local step
  (value, delta and gradient accumulators), as the pre-sync segment would have at the next
  exchange (:func:`.reference.presync`);
* those rows' gradient is zeroed, so that the exchange which later pushes the batch's
  gradient applies nothing twice (its rows not stored here keep theirs and are pushed as
  before). With row-wise Adagrad an owned row then takes two updates where the merged update
  took one: this rank's gradient now, the peers' pushes at the next exchange;
* the next step, taking its primed rows, reads its stored rows again from the table
  (:func:`refresh_stored`).

Only rows not stored here and the peers' pushes then arrive a step late. Versions and pending
counts are not touched here: the pre-sync segment counts the batch once, as before.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

import torch

from hetgmp.embedding.kernels import scatter_add_rows
from hetgmp.embedding.kernels.launcher import row_tiles

if TYPE_CHECKING:  # pragma: no cover
    from hetgmp.embedding.batch import Prep
    from hetgmp.embedding.padded.buffers import StaticExchange


def _stored_masks(st: StaticExchange, prep: Prep) -> tuple[torch.Tensor, torch.Tensor]:
    """(own, mirror) masks over the first ``cap.u`` entries of ``prep`` (block order: own
    rows, then mirrors by owner, then rows not stored here)."""
    w, cu = st.w, st.cap.u
    i = torch.arange(cu, device=prep.u.device)
    n_own = prep.blocks[st.rank]
    n_stored = prep.blocks[: 2 * w].sum()
    own = i < n_own
    return own, (i >= n_own) & (i < n_stored)


@functools.lru_cache(maxsize=1)
def _triton() -> Any:
    return importlib.import_module("hetgmp.embedding.padded.local_triton")


def _launch(st: StaticExchange, kernel: Any, u: int, *args: Any, **consts: Any) -> None:
    """``kernel`` over ``u`` entries in row tiles (the fused segments' tile rule)."""
    tr = _triton().triton
    br, bd = row_tiles(tr, st.d)
    kernel[(max(1, tr.cdiv(u, br)),)](
        *args, W=st.w, WP=tr.next_power_of_2(st.w), D=st.d, BR=br, BD=bd, **consts
    )


def apply_stored(st: StaticExchange, prep: Prep, grad: torch.Tensor) -> None:
    """Apply the batch ``prep``'s summed gradient ``grad`` (``[>= cap.u, D]``, block order)
    to its own rows and mirrors now and zero it there (module docstring). No host sync.
    Fused in one kernel with the Triton backend; else the torch ops below (its reference)."""
    if st.kernels == "triton":
        e = st.store
        state = e.opt_state_full if st.sw else e.weight_full  # (SGD: never read)
        _launch(
            st, _triton().apply_stored_kernel, st.cap.u, prep.blocks, prep.slot, grad,
            e.weight_full, state, e.delta_acc_full, e.grad_acc_full, st.rank, st.cap.u,
            e.n_own, -float(st.lr), float(st.opt.eps), SW=int(bool(st.sw)),
        )  # fmt: skip
        return
    e, cu = st.store, st.cap.u
    own, mir = _stored_masks(st, prep)
    stored = own | mir
    slot = prep.slot[:cu]
    g = grad[:cu]
    rows = torch.where(stored, slot, e.trash_slot)  # (padding and rows not stored: trash)
    if st.sw:  # (the rows' own state: owned rows' and mirrors' alike)
        delta, state = st.opt.local_step(e.opt_state_full.index_select(0, rows), g)
        e.opt_state_full.index_copy_(0, rows, state)
    else:
        delta = g * -st.lr
    scatter_add_rows(e.weight_full, rows, delta, 1.0, backend=st.kernels)
    mi = torch.where(mir, slot - e.n_own, e.n_mir)  # (mirror row n_mir: trash)
    scatter_add_rows(e.delta_acc_full, mi, delta, 1.0, backend=st.kernels)
    scatter_add_rows(e.grad_acc_full, mi, g, 1.0, backend=st.kernels)
    g.masked_fill_(stored[:, None], 0.0)


def refresh_stored(st: StaticExchange, prep: Prep, values: torch.Tensor) -> None:
    """The primed ``values`` (block order) of ``prep``'s rows stored here, read again from the
    table: they were answered before the last step's :func:`apply_stored`."""
    if st.kernels == "triton" and values.dtype == torch.float32:
        k = min(st.cap.u, values.shape[0])
        _launch(
            st, _triton().refresh_stored_kernel, k, prep.blocks, prep.slot,
            st.store.weight_full, values, st.rank, k,
        )  # fmt: skip
        return
    own, mir = _stored_masks(st, prep)
    k = min(st.cap.u, values.shape[0])
    stored = (own | mir)[:k]
    rows = st.store.weight_full.index_select(0, torch.where(stored, prep.slot[:k], 0))
    head = values[:k]
    head.copy_(torch.where(stored[:, None], rows.to(head.dtype), head))
