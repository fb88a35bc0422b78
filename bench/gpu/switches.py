"""Run a script with module switches set (A/B runs of code paths that are off by default until
measured), e.g. under torchrun::

    torchrun --nproc_per_node 2 bench/gpu/switches.py \
        hetgmp.embedding.padded.owner_update.FUSED_OWNER_UPDATE=1 \
        hetgmp.embedding.padded.whole.TIGHT_PUSHES=1 -- examples/hetuctr.py --dataset ...

Each ``MODULE.NAME=0|1`` sets a boolean module attribute that must already exist (a typo is
an error, not a silent no-op); everything after ``--`` is the script and its arguments.
``ablate:NAME`` leaves a part of the step out (diagnosis only: :mod:`ablations`);
``dilate:POINT:US`` delays the step by US at POINT (diagnosis only: :mod:`dilations`);
``carveout:N`` leaves N SMs out of cuBLAS's GEMMs (``torch._C._set_sm_carveout_experimental``),
so that kernels launched beside a persistent GEMM (device barriers, NCCL) find an SM at once;
``blas:cublaslt`` routes every GEMM through cuBLASLt (where the carveout surely applies).
"""

from __future__ import annotations

import importlib
import runpy
import sys


def main(argv: list[str]) -> None:
    if "--" not in argv:
        raise SystemExit("usage: switches.py MODULE.NAME=0|1 ... -- SCRIPT [ARGS...]")
    cut = argv.index("--")
    for item in argv[:cut]:
        if item.startswith("ablate:"):  # (diagnosis only: parts of the step left out)
            from ablations import apply

            apply(item.split(":", 1)[1])
            continue
        if item.startswith("dilate:"):  # (diagnosis only: is a point on the critical path)
            from dilations import apply as dilate

            dilate(item.split(":", 1)[1])
            continue
        if item.startswith("carveout:"):
            import torch

            torch._C._set_sm_carveout_experimental(int(item.split(":", 1)[1]))
            continue
        if item.startswith("blas:"):
            import torch

            if torch.cuda.is_available():  # (a CPU build has no cuBLASLt: smoke runs)
                torch.backends.cuda.preferred_blas_library(item.split(":", 1)[1])
            continue
        target, _, value = item.partition("=")
        mod_name, _, attr = target.rpartition(".")
        mod = importlib.import_module(mod_name)
        if not hasattr(mod, attr) or value not in ("0", "1"):
            raise SystemExit(f"switches.py: {item!r}: no switch {attr} in {mod_name}, or not 0/1")
        setattr(mod, attr, value == "1")
    script, *rest = argv[cut + 1 :]
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
