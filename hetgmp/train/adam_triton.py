"""The Triton kernel of :func:`hetgmp.train.adam_kernel.adam_flat_step` (imported only when
Triton is; the reference is :meth:`hetgmp.train.flat_adam.FlatAdam.step`'s torch ops)."""

import triton
import triton.language as tl

# n_params (the dense parameters' count) is fixed for a model, not a batch size: it keeps
# Triton's specialization (a multiple of 16 lets the masked loads be vector loads), unlike the
# batch-size arguments of the embedding kernels (tests/test_kernel_specialization.py).


@triton.jit
def adam_flat_kernel(
    p_ptr, g_ptr, m_ptr, v_ptr, step_ptr, n_params, lr, b1, b2, eps, BLOCK: tl.constexpr
):
    # Adam (no weight decay) over flat buffers, one pass: m += (1 - b1)(g - m); v = b2 v +
    # (1 - b2) g^2; p -= lr m / ((sqrt(v) / sqrt(1 - b2^t) + eps) (1 - b1^t)); t read on the
    # device (capturable)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_params
    t = tl.load(step_ptr)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
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
