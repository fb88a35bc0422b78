"""Where a padded payload's row for peer ``j`` starts, for the kernels that write payloads
(pack, answer): in this rank's send buffer, or straight in peer ``j``'s receive buffer (peer
memory, :mod:`.peer_payloads`). This module imports triton.

Why: the copies of the payloads into the peers' buffers (or NCCL's all-to-alls) are a pass over
every padded byte on the 2-GPU step's chain; a kernel that writes each entry where the peer
reads it needs only the barrier after it.
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def payload_row(send_ptr, j, m, stride, PEER: tl.constexpr):
    # a float32 pointer per entry to the start of its peer j's row. PEER False: row j of the
    # send buffer [w, stride]; True: send_ptr is an int64 table of the w rows' addresses in
    # the peers' receive buffers (16-byte aligned: checked where the table is made; the hint
    # lets the row copies store 16 bytes at a time, as into the send buffer: without it the
    # sm_90 code of answer_queries stored 4 bytes at a time, 34 scalar stores against 8 v4)
    if PEER:
        a = tl.load(send_ptr + j, mask=m, other=0)
        return tl.multiple_of(a.to(tl.pointer_type(tl.float32)), 16)
    else:
        return send_ptr + j.to(tl.int64) * stride


@triton.jit
def as64(rows):
    # the same addresses as int64 pointers (int64 fields travel as float32 pairs)
    return rows.to(tl.pointer_type(tl.int64), bitcast=True)


@triton.jit
def as32(rows):
    return rows.to(tl.pointer_type(tl.int32), bitcast=True)
