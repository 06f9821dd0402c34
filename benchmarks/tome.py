"""Token merging (ToMe) speed: images/s of a ViT at merge R = 0/8/13/16, timed paired in one run.

Usage: python benchmarks/tome.py [--models vit_small_patch16_224] [--batches 8] [--dtypes fp32] [--repeats 10]
                                 [--threads N] [--clock wall|cpu]
On a machine others are using, `--threads 1 --clock cpu` times this process's own CPU seconds, which other
processes' load does not inflate (with 2 threads on 2 busy cores the threads wait on each other).
bf16 runs only where the CPU has native bf16 (elsewhere it is emulated and says nothing about merging).
Each model is built once per R (random weights: merging costs the same whatever the weights, and accuracy is not
measured here) with `create_model(..., merge=R)`, so this machine's fast paths apply as they do for a user.
The R variants of one (model, batch, dtype) are timed round-robin by vitkit.timing, the order reversed every
round; a speed-up is the median of the per-round ratios against R=0.
Writes benchmarks/results/tome.{md,json} (`--out` names another stem).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
from _results import write_results  # benchmarks/_results.py, beside this script

from vitkit.api import create_model
from vitkit.hardware import detect
from vitkit.timing import CLOCKS, paired_ratio, paired_times

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def time_merges(name: str, batch: int, dtype: str, merges: list[int], warmup: int, repeats: int,
                clock: str) -> list[dict]:
    """One row per R: median seconds per batch, images/s and the paired speed-up against the first R."""
    x = torch.randn(batch, 3, 224, 224, dtype=DTYPES[dtype])
    models = {r: create_model(name, merge=r).eval().to(DTYPES[dtype]) for r in merges}

    def call(model):
        def run():
            with torch.inference_mode():
                model(x)
        return run

    times = paired_times({r: call(m) for r, m in models.items()}, warmup=warmup, repeats=repeats, clock=clock)
    base = merges[0]
    rows = []
    for r in merges:
        with torch.inference_mode():
            tokens = models[r].forward_features(x[:1]).shape[1]
        median = statistics.median(times[r])
        rows.append(dict(model=name, batch=batch, dtype=dtype, merge=r, final_tokens=tokens,
                         seconds_per_batch=median, images_per_s=batch / median,
                         speedup_vs_r0=paired_ratio(times[base], times[r])))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vit_small_patch16_224")
    p.add_argument("--batches", default="8")
    p.add_argument("--dtypes", default="fp32")
    p.add_argument("--merges", default="0,8,13,16")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--clock", choices=CLOCKS, default="wall")
    p.add_argument("--out", default="tome", help="results file stem under benchmarks/results/")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    merges = [int(r) for r in args.merges.split(",")]
    caps = detect()
    dtypes = [d for d in args.dtypes.split(",") if d == "fp32" or caps.native_bf16]
    rows = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for dtype in dtypes:
                rows += time_merges(name, batch, dtype, merges, args.warmup, args.repeats, args.clock)
                print(json.dumps(rows[-len(merges):]), flush=True)
    command = ("python benchmarks/tome.py --models {} --batches {} --dtypes {} --merges {} --warmup {} --repeats {}"
               " --clock {}".format(args.models, args.batches, ",".join(dtypes), args.merges, args.warmup,
                                    args.repeats, args.clock)
               + (f" --threads {args.threads}" if args.threads else "")
               + (f" --out {args.out}" if args.out != "tome" else ""))
    lines = [f"| model | batch | dtype | R | tokens after the last block | ms / batch ({args.clock}) | img/s | "
             "speed-up vs R=0 (paired) |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['batch']} | {r['dtype']} | {r['merge']} | {r['final_tokens']} | "
              f"{1000 * r['seconds_per_batch']:.0f} | {r['images_per_s']:.1f} | {r['speedup_vs_r0']:.2f}x |"
              for r in rows]
    print(write_results(args.out, command, caps, lines, rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
