"""vitkit's OpenVINO runner against OpenVINO called directly, alone: the same engine, two ways in.

Usage: python benchmarks/openvino_runner.py [--models vit_small_patch16_224 vit_base_patch16_224]
                                            [--batches 8] [--precisions bf16] [--repeats 9] [--threads N]
Per (model, batch, precision), timed round-robin by vitkit.timing in one run, nothing else in the rounds:
  direct  OpenVINO on timm's model as its documentation shows (vitkit.bench.openvino_fn: convert_model in memory,
          compile_model with the precision hint, the thread count and LATENCY, one infer request);
  dynamic vitkit.runner(model, backend="openvino"): vitkit's IR export (cached by content hash, batch left
          dynamic) behind the Runner call a user makes, torch tensor in and out;
  runner  the same built for the batch (batch_size=B: the graph compiled with the batch fixed), as "auto" builds it;
  split   that with streams=min(batch, threads) (runner.split_streams): the THROUGHPUT hint, the batch split
          into one slice a stream, each slice's shape fixed (what vitkit.runner's "auto" also times; batches of 1
          and one thread have nothing to split).
`vitkit bench` times these two among six cases a round; this separates the runner's own cost from the spread of
a crowded round. Random weights (the speed does not depend on them); bf16 only where the CPU has native bf16.
Writes benchmarks/results/openvino-runner.{md,json} (`--out` names another stem).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch
from _results import write_results  # benchmarks/_results.py, beside this script

from vitkit.bench import build_vitkit, openvino_fn, timm_twin
from vitkit.export.runner import runner, split_streams
from vitkit.hardware import detect
from vitkit.timing import paired_ratio, paired_times


def main(argv: list[str]) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["vit_small_patch16_224", "vit_base_patch16_224"])
    ap.add_argument("--batches", nargs="+", type=int, default=[8])
    ap.add_argument("--precisions", nargs="+", default=["bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="openvino-runner", help="results file stem under benchmarks/results/")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    caps = detect()
    precisions = [p for p in args.precisions if p == "fp32" or caps.native_bf16]
    table = ["| model | batch | precision | OpenVINO direct img/s | dynamic vs direct (paired) | runner img/s "
             "| runner vs direct (paired) | split: streams, img/s | split vs direct (paired) |",
             "|---|---:|---|---:|---:|---:|---:|---|---:|"]
    split = {b: split_streams(b) for b in args.batches}
    rows = []
    for name in args.models:
        vk = build_vitkit(name).eval()
        tm = timm_twin(vk).eval()
        C, (H, W) = vk.cfg.in_chans, vk.cfg.img_size
        for batch in args.batches:
            x = torch.randn(batch, C, H, W, generator=torch.Generator().manual_seed(0))
            for precision in precisions:
                dynamic = runner(vk, backend="openvino", precision=precision)
                run = runner(vk, backend="openvino", precision=precision, batch_size=batch)
                fns = {"direct": openvino_fn(tm, x, precision), "dynamic": lambda: dynamic(x), "runner": lambda: run(x)}
                if split[batch] > 1:
                    across = runner(vk, backend="openvino", precision=precision, streams=split[batch],
                                    batch_size=batch)
                    fns["split"] = lambda: across(x)
                times = paired_times(fns, warmup=2, repeats=args.repeats)
                speed = {k: batch / statistics.median(t) for k, t in times.items()}
                ratio = {k: paired_ratio(times["direct"], t) for k, t in times.items()}
                rows.append(dict(model=name, batch=batch, precision=precision, direct_img_s=speed["direct"],
                                 dynamic_img_s=speed["dynamic"], dynamic_vs_direct=ratio["dynamic"],
                                 runner_img_s=speed["runner"], runner_vs_direct=ratio["runner"],
                                 split_streams=split[batch], split_img_s=speed.get("split"),
                                 split_vs_direct=ratio.get("split")))
                tail = (f"{split[batch]}, {speed['split']:.1f} | {ratio['split']:.2f}x" if "split" in speed
                        else "- | -")
                table.append(f"| {name} | {batch} | {precision} | {speed['direct']:.1f} | {ratio['dynamic']:.2f}x | "
                             f"{speed['runner']:.1f} | {ratio['runner']:.2f}x | {tail} |")
                print(table[-1], flush=True)
    command = "python benchmarks/openvino_runner.py " + " ".join(argv)
    return write_results(args.out, command.strip(), caps, table, rows)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
