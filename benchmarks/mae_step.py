"""MAE's point in time: an encoder training step on the visible 25% of the patches against a step on all of
them, same model, same batch, timed round-robin in one process (vitkit.timing.paired_times); the decoder is
left out, so the ratio is the encoder's alone. Writes benchmarks/results/mae-step.{md,json}.
Usage: python benchmarks/mae_step.py [--model vit_small_patch16_224] [--batch 16] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import vitkit
from vitkit.bench import machine_info
from vitkit.models.mae import random_masking
from vitkit.runtime import torch_threads
from vitkit.timing import paired_ratio, paired_times

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="vit_small_patch16_224")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--mask-ratio", type=float, default=0.75)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    with torch_threads(args.threads):
        torch.manual_seed(0)
        model = vitkit.create_model(args.model, num_classes=0).train()
        c = model.cfg
        x = torch.randn(args.batch, c.in_chans, *c.img_size)
        L = model.patch_embed.num_patches
        keep, _, _ = random_masking(args.batch, L, args.mask_ratio)

        def step(ids):
            def run():
                model.zero_grad(set_to_none=True)
                model(x, keep=ids, features=True).float().square().mean().backward()
            return run

        times = paired_times({"full": step(None), "visible": step(keep)}, warmup=2, repeats=args.repeats)
        ratio = paired_ratio(times["full"], times["visible"])
        info = machine_info()
    report = {"model": args.model, "batch": args.batch, "patches": L, "visible": keep.shape[1],
              "mask_ratio": args.mask_ratio, "full_s": min(times["full"]), "visible_s": min(times["visible"]),
              "speedup": ratio, "machine": info,
              "command": f"python benchmarks/mae_step.py --model {args.model} --batch {args.batch}"
                         + (f" --threads {args.threads}" if args.threads else "")}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "mae-step.json").write_text(json.dumps(report, indent=2) + "\n")
    md = (f"MAE encoder step (forward + backward), {args.model}, batch {args.batch}, {info['threads']} threads, "
          f"{info['cpu']}: all {L} patches {report['full_s'] * 1e3:.0f} ms, visible {keep.shape[1]} "
          f"({100 * (1 - args.mask_ratio):.0f}%) {report['visible_s'] * 1e3:.0f} ms: {ratio:.2f}x cheaper "
          "(median of paired rounds)\n")
    (RESULTS / "mae-step.md").write_text(md)
    print(md, end="")


if __name__ == "__main__":
    main()
