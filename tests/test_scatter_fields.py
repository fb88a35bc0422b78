"""The gradient sum with per-field runs (``scatter_add_rows(..., fields=F)``: each program sorts
FIELD_SAMPLES samples of one field by row and adds one atomic per run) against the torch reference
(``index_add_``), in Triton's interpreter on CPU (and compiled on a GPU, marked): hot rows,
padding (negative ids), a batch that is not a multiple of the program's samples, a dimension
past one column tile with a masked tail, bf16 gradients, and ``alpha``."""

from __future__ import annotations

import textwrap

import pytest
import torch
from interpreted import compiled, run_interpreted

pytest.importorskip("triton")

CASES = textwrap.dedent(
    """
    import torch
    from hetgmp.embedding.kernels import rows as R
    from hetgmp.embedding.kernels import scatter_add_rows, scatter_add_rows_reference

    def check(device):
        g = torch.Generator().manual_seed(0)
        calls = []
        plain, interpreted = R._scatter_add_fields, R.FIELD_RUNS_INTERPRETED
        samples = R.FIELD_SAMPLES
        R._scatter_add_fields = lambda *a: calls.append(1) or plain(*a)
        R.FIELD_RUNS_INTERPRETED = True  # (off in the interpreter's training tests: slow)
        # (in the interpreter programs of 16 samples, not 64: the kernel is generic in it and
        # the interpreter's sort and scan cost grows with it, the scan's per element; 40
        # samples: 3 programs a field, the last one partial; the two column tiles of 72 in one
        # partial program. A GPU keeps the default.)
        if device == "cpu":
            R.FIELD_SAMPLES = 16
        try:
            for b, f, d, rows in ((40, 2, 16, 40), (13, 2, 72, 9)):
                # hot rows: u^4-distributed ids, many repeats of a few rows in every field
                idx = (torch.rand(b, f, generator=g) ** 4 * rows).long()
                idx[torch.rand(b, f, generator=g) < 0.1] = -1  # padding: skipped
                for src_dtype in (torch.float32, torch.bfloat16):
                    src = torch.randn(b, f, d, generator=g).to(src_dtype)
                    table = torch.randn(rows, d, generator=g)
                    keep = idx.reshape(-1) >= 0
                    want = scatter_add_rows_reference(
                        table.clone(), idx.reshape(-1)[keep], src.reshape(-1, d)[keep].float(),
                        -0.5,
                    )
                    got = scatter_add_rows(
                        table.clone().to(device), idx.to(device), src.to(device), -0.5,
                        backend="triton", fields=f,
                    )
                    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-4)
            assert len(calls) == 4, calls  # (every case took the per-field kernel)
        finally:
            R._scatter_add_fields, R.FIELD_RUNS_INTERPRETED = plain, interpreted
            R.FIELD_SAMPLES = samples
        print("ok")
    """
)


def test_field_runs_match_reference_in_interpreter(tmp_path) -> None:
    assert run_interpreted(tmp_path / "field_checks.py", CASES, calls=("check('cpu')",)) == ["ok"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_field_runs_match_reference_on_gpu() -> None:
    compiled(CASES)["check"]("cuda")
