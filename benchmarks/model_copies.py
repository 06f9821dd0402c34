"""vitkit eager against timm eager with copies: the noise floor of a "vs timm" ratio, in one process.

Usage: python benchmarks/model_copies.py [--model vit_small_patch16_224] [--batch 8] [--copies 3] [--repeats 12]
The bench's vitkit model (this machine's fast paths applied, as `vitkit bench` builds it) and its timm twin (the
same weights) are deep-copied `--copies` times each; every copy is timed round-robin by vitkit.timing (no-grad
inference, fp32, 2 threads), and each row says how fast it ran against the first timm copy. The timm copies' own
spread is what a vitkit row has to beat before a difference means anything. Run it under another allocator setting
(for example `MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824`, glibc's) to see what the
allocator costs both. Prints one line per copy; writes nothing.
"""
from __future__ import annotations

import argparse
import copy
import statistics

import torch

from vitkit.api import with_fast_paths
from vitkit.bench import build_vitkit, timm_twin
from vitkit.timing import paired_times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit_small_patch16_224")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    vk = with_fast_paths(build_vitkit(args.model)).eval()
    tm = timm_twin(vk).eval()
    x = torch.randn(args.batch, *vk.preprocess.input_size)
    models = {}
    for i in range(args.copies):
        models[f"vitkit{i}"] = copy.deepcopy(vk)
        models[f"timm{i}"] = copy.deepcopy(tm)

    def call(model):
        def run():
            with torch.inference_mode():
                return model(x)
        return run

    times = paired_times({name: call(m) for name, m in models.items()}, warmup=2, repeats=args.repeats)
    ref = statistics.median(times["timm0"])
    for name, t in times.items():
        med = statistics.median(t)
        print(f"{name}: {args.batch / med:.2f} img/s, {ref / med:.3f}x the first timm copy", flush=True)


if __name__ == "__main__":
    main()
