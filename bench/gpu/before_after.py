"""Compare ``bench/gpu/run.sh`` results of two code versions run side by side in one device call
(issue 13's "no loss of speed" check): hetgmp's contenders, samples/s per version and the ratio.

    python bench/gpu/before_after.py --before old.json old2.json --after new.json new2.json \
        --out bench/results/gpu/redesign_before_after.md

Several files per side are alternating runs of the same call (old, new, new, old): the table
shows each run and the mean ratio, so run-to-run noise can be read next to the difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

Key = tuple[str, str, str, int, int]


def _figures(path: Path) -> dict[Key, float]:
    """samples/s per (mode, model+precision, contender, world, batch) of one results.json."""
    out: dict[Key, float] = {}
    for run in json.loads(path.read_text())["runs"]:
        for r in run["results"]:
            if not r["contender"].startswith("hetgmp") or not r.get("samples_per_s"):
                continue
            model = f"{r['model']} {r['precision']}" if r.get("model") else "-"
            key = (r["mode"], model, r["contender"], int(r["world"]), int(r["batch_per_gpu"]))
            out[key] = float(r["samples_per_s"])
    return out


def table(before: list[Path], after: list[Path]) -> str:
    """The markdown comparison."""
    b = [_figures(p) for p in before]
    a = [_figures(p) for p in after]
    keys = sorted(set().union(*b, *a))
    head = [f"before {i + 1}" for i in range(len(b))] + [f"after {i + 1}" for i in range(len(a))]
    lines = [
        "| step | model | contender | GPUs | batch/GPU | "
        + " | ".join(head)
        + " | after / before |",
        "|---|---|---|---|---|" + "---|" * len(head) + "---|",
    ]
    ratios = []
    for k in keys:
        bv = [f.get(k) for f in b]
        av = [f.get(k) for f in a]
        cells = [f"{v / 1e6:.2f}M" if v else "-" for v in bv + av]
        ok_b, ok_a = [v for v in bv if v], [v for v in av if v]
        ratio = statistics.mean(ok_a) / statistics.mean(ok_b) if ok_a and ok_b else None
        if ratio:
            ratios.append(ratio)
        rs = f"{ratio:.2f}x" if ratio else "-"
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | " + " | ".join(cells) + f" | {rs} |"
        )
    if ratios:
        lines.append("")
        lines.append(
            f"Summary: median after/before {statistics.median(ratios):.2f}x over "
            f"{len(ratios)} figures (min {min(ratios):.2f}x, max {max(ratios):.2f}x)."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", nargs="+", type=Path, required=True)
    ap.add_argument("--after", nargs="+", type=Path, required=True)
    ap.add_argument("--out", type=Path, help="write the table here (else print)")
    ap.add_argument("--title", default="Before / after")
    args = ap.parse_args()
    text = f"# {args.title}\n\n" + table(args.before, args.after)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
