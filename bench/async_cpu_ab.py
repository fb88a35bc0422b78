"""A/B of ``--sync async`` on CPU ranks: an older checkout against this one, interleaved
rounds in fresh processes (the development box is noisy: compare within a run).

    mkdir -p bench/work/base && git archive BASE hetgmp examples setup.py src pyproject.toml \
        CMakeLists.txt | tar -x -C bench/work/base && cp hetgmp/_native*.so bench/work/base/hetgmp/
    python bench/async_cpu_ab.py bench/work/base --rounds 3

Each run trains WDL at a small batch (host work dominates, as on GPUs) on 2 spawned gloo
ranks, ``--sync async --bound 100 --max-lag 100``, and prints one JSON line: samples/s (after
``--warmup-steps``), AUC and rank 0's ms per step by phase; then the medians per tree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rank(env, cfg):  # noqa: ANN001, ANN202 - (spawned by name: module level)
    from hetgmp.train.run import train

    return train(cfg, env)


def one_run(tree: Path, data: Path, steps: int, batch: int) -> dict:
    """(In a fresh process, ``tree`` first on the path) one training; its figures."""
    sys.path.insert(0, str(tree))
    from hetgmp.comm.spawn import spawn_ranks
    from hetgmp.config import validate
    from hetgmp.train.config import TrainConfig

    cfg = validate(TrainConfig(
        dataset=str(data), model="wdl", batch_size=batch, embed_dim=8, epochs=1, iter=steps,
        log_every=100_000, progress=False, device="cpu", threads=1, warmup_steps=20,
        timeout_s=120.0, seed=0, sync="async", bound=100, max_lag=100, async_host="127.0.0.1",
    ))  # fmt: skip
    r = spawn_ranks(_rank, 2, cfg, timeout_s=600)[0]
    ph = r["async"]["phase_ms_per_step"][0]
    keep = ("step", "push", "read", "peer_wait", "dense", "compute")
    return {"speed": round(r["speed"]), "auc": round(r["val_auc"], 4), **{k: ph[k] for k in keep}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", type=Path, help="the older checkout (native extension built)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300, help="global steps (--iter)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--samples", type=int, default=200_000, help="generated set size")
    p.add_argument("--work", type=Path, default=Path("/tmp/hetgmp-async-cpu-ab"))
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    data = a.work / f"criteo-like-{a.samples}"
    if a.child:
        print(json.dumps(one_run(Path(a.child[0]), Path(a.child[1]), a.steps, a.batch)))
        return
    if not (data / "meta.json").exists():
        sys.path.insert(0, str(ROOT))
        from hetgmp.data.generate import generate_criteo_like

        generate_criteo_like(data, num_samples=a.samples, seed=0, progress=False, overwrite=True)
    got: dict[str, list[dict]] = {"base": [], "new": []}
    for _ in range(a.rounds):
        for name, tree in (("base", a.base.resolve()), ("new", ROOT)):
            cmd = [sys.executable, __file__, str(a.base), "--steps", str(a.steps), "--batch",
                   str(a.batch), "--samples", str(a.samples), "--work", str(a.work),
                   "--child", str(tree), str(data)]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tree)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            got[name].append(row)
            print(json.dumps({"tree": name, **row}), flush=True)
    med = {n: statistics.median(r["speed"] for r in rows) for n, rows in got.items()}
    print(f"median samples/s: base {med['base']:.0f}, new {med['new']:.0f} "
          f"({med['new'] / med['base']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
