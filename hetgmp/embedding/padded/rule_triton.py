"""The staleness rule (:mod:`hetgmp.embedding.protocol`) restated for the fused Triton
kernels, which cannot call torch functions: each function here is the same comparison as
the protocol function of the same name, and tests/test_staleness_rule.py runs both on the same
inputs. The kernels of :mod:`.kernels_triton` and :mod:`.presync_triton` compare lags and
pending counts with ``bound`` only through these (the test also checks that)."""

from __future__ import annotations

import triton
import triton.language as tl  # noqa: F401 - the interpreter wants it among a jit function's globals


@triton.jit
def within_bound(lag, bound):
    # a mirror read lag owner updates behind is used as it is (protocol.within_bound)
    return lag <= bound


@triton.jit
def beyond_bound(lag, bound):
    # ... or refreshed from its owner (protocol.beyond_bound)
    return lag > bound


@triton.jit
def is_due(pending, bound):
    # a mirror with pending unpushed updates pushes now (protocol.is_due)
    return pending > bound
