"""The Triton kernels of :mod:`hetgmp.train.adam_kernel` (imported only when Triton is; the
reference is :meth:`hetgmp.train.flat_adam.FlatAdam.step`'s torch ops)."""

import triton
import triton.language as tl

# n_params (the dense parameters' count) is fixed for a model, not a batch size: it keeps
# Triton's specialization (a multiple of 16 lets the masked loads be vector loads), unlike the
# batch-size arguments of the embedding kernels (tests/test_kernel_specialization.py).


@triton.jit
def _adam(p_ptr, g, m_ptr, v_ptr, step_ptr, offs, mask, lr, b1, b2, eps):
    # Adam (no weight decay) of one block, given its gradient g: m += (1 - b1)(g - m); v = b2 v
    # + (1 - b2) g^2; p -= lr m / ((sqrt(v) / sqrt(1 - b2^t) + eps) (1 - b1^t)); t read on the
    # device (capturable)
    t = tl.load(step_ptr)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    m = m + (1.0 - b1) * (g - m)
    v = v * b2 + (1.0 - b2) * g * g
    bc1 = 1.0 - tl.exp(t * tl.log(b1))
    bc2_sqrt = tl.sqrt(1.0 - tl.exp(t * tl.log(b2)))
    denom = tl.sqrt(v) / bc2_sqrt + eps
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    tl.store(p_ptr + offs, p - (lr / bc1) * m / denom, mask=mask)


@triton.jit
def adam_flat_kernel(
    p_ptr, g_ptr, m_ptr, v_ptr, step_ptr, n_params, lr, b1, b2, eps, BLOCK: tl.constexpr
):
    # Adam over flat buffers, one pass
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_params
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    _adam(p_ptr, g, m_ptr, v_ptr, step_ptr, offs, mask, lr, b1, b2, eps)


@triton.jit
def adam_peer_kernel(
    p_ptr, gptrs_ptr, m_ptr, v_ptr, step_ptr, n_params, lr, b1, b2, eps, W: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    # Adam whose gradient is the sum of every rank's gradient buffer, read in peer memory
    # (gptrs_ptr: the W buffers' addresses, int64, in rank order; the adds in that order on
    # every rank, so every rank's parameters stay bit-identical)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_params
    g = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in tl.static_range(W):
        base = tl.load(gptrs_ptr + r).to(tl.pointer_type(tl.float32))
        g += tl.load(base + offs, mask=mask, other=0.0)
    _adam(p_ptr, g, m_ptr, v_ptr, step_ptr, offs, mask, lr, b1, b2, eps)
