"""The cost of NaFlex padding: a ViT on a padded batch of mixed aspect ratios against square inputs, paired.

Usage: python benchmarks/naflex_padding.py [--model vit_small_patch16_224] [--max-tokens 196] [--batch 8]
                                           [--dtypes fp32,bf16] [--repeats 10] [--threads N]
Four inputs of one batch size, each timed round-robin by vitkit.timing in one run (random weights: padding costs
the same whatever the weights):
  square        the plain model on [B, 3, 224, 224] (196 patches each), the reference;
  square-naflex the same images as a PatchBatch (no padding, but the mask path: per-grid positions, a key mask);
  mixed-padded  B images of eight aspect ratios (1:1 to 1:2 and 2:1), each resized to its largest grid within
                the token budget, padded to the longest with an attention mask, as `--max-tokens` runs them;
  mixed-alone   the same B images one at a time (no padding, B calls), the alternative to padding.
Reported per input: valid patches, padded share, ms / batch, paired speed against square (square's time over
the input's: > 1 faster), and ms per 1,000 valid
patches (padding paid for but not used shows there).
bf16 (the model cast to bf16) runs only where the CPU has native bf16.
Writes benchmarks/results/naflex-padding.{md,json}.
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
from vitkit.layers.naflex import grid_for_budget, image_patches, pad_patches
from vitkit.timing import CLOCKS, paired_ratio, paired_times

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# width / height of the mixed batch's images (photos, phone portraits, panoramas)
ASPECTS = (1.0, 4 / 3, 3 / 4, 16 / 9, 9 / 16, 3 / 2, 2.0, 0.5)


def inputs(batch: int, patch: int, max_tokens: int, dtype: torch.dtype) -> dict:
    """The four inputs; each image a random [3, Gh*P, Gw*P] at its grid within the budget."""
    side = int(round((max_tokens ** 0.5) * patch))
    square = torch.randn(batch, 3, side, side, dtype=dtype)  # [B, 3, H, W]
    items = []
    for i in range(batch):
        aspect = ASPECTS[i % len(ASPECTS)]
        gh, gw = grid_for_budget(480, int(round(480 * aspect)), patch, max_tokens)
        items.append(image_patches(torch.randn(3, gh * patch, gw * patch, dtype=dtype), patch))
    return dict(square=square,
                square_naflex=pad_patches([image_patches(img, patch) for img in square]),
                mixed_padded=pad_patches(items),
                mixed_alone=[pad_patches([it]) for it in items])


def valid_and_padded(x, patch: int) -> tuple[int, float]:
    """Valid patches of an input and its padded share."""
    if isinstance(x, torch.Tensor):
        return x.shape[0] * (x.shape[2] // patch) * (x.shape[3] // patch), 0.0
    if isinstance(x, list):
        return sum(int(b.lengths.sum()) for b in x), 0.0
    return int(x.lengths.sum()), x.padded_fraction


def time_inputs(name: str, batch: int, max_tokens: int, dtype: str, warmup: int, repeats: int,
                clock: str) -> list[dict]:
    model = create_model(name).eval().to(DTYPES[dtype])
    patch = model.patch_embed.patch_size[0]
    xs = inputs(batch, patch, max_tokens, DTYPES[dtype])

    def call(x):
        def run():
            with torch.inference_mode():
                for part in (x if isinstance(x, list) else [x]):
                    model(part)
        return run

    times = paired_times({k: call(x) for k, x in xs.items()}, warmup=warmup, repeats=repeats, clock=clock)
    rows = []
    for k, x in xs.items():
        valid, padded = valid_and_padded(x, patch)
        median = statistics.median(times[k])
        rows.append(dict(model=name, batch=batch, dtype=dtype, max_tokens=max_tokens, input=k.replace("_", "-"),
                         valid_patches=valid, padded_fraction=padded, seconds_per_batch=median,
                         ratio_vs_square=paired_ratio(times["square"], times[k]),
                         ms_per_1000_valid=1e6 * median / valid))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_small_patch16_224")
    p.add_argument("--max-tokens", type=int, default=196)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--clock", choices=CLOCKS, default="wall")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    caps = detect()
    dtypes = [d for d in args.dtypes.split(",") if d == "fp32" or caps.native_bf16]
    rows = []
    for dtype in dtypes:
        rows += time_inputs(args.model, args.batch, args.max_tokens, dtype, args.warmup, args.repeats, args.clock)
        print(json.dumps(rows[-4:]), flush=True)
    command = (f"python benchmarks/naflex_padding.py --model {args.model} --max-tokens {args.max_tokens} "
               f"--batch {args.batch} --dtypes {','.join(dtypes)} --warmup {args.warmup} --repeats {args.repeats} "
               f"--clock {args.clock}" + (f" --threads {args.threads}" if args.threads else ""))
    lines = [f"| model | dtype | input | valid patches | padded | ms / batch ({args.clock}) | speed vs square (paired, > 1 faster) | "
             "ms / 1,000 valid patches |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['dtype']} | {r['input']} | {r['valid_patches']} | {100 * r['padded_fraction']:.1f}% | "
              f"{1000 * r['seconds_per_batch']:.1f} | {r['ratio_vs_square']:.2f}x | {r['ms_per_1000_valid']:.2f} |"
              for r in rows]
    print(write_results("naflex-padding", command, caps, lines, rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
