"""`make bench`: the full CPU harness, vitkit against timm, written to benchmarks/results/cpu.{md,json}.

Run on an idle machine (it takes a while: ViT-B/16 at batch 32, torch.compile and ONNX exports).
Extra arguments go to `vitkit bench`, e.g. `--quick` for a smoke run or `--clock cpu --threads 1`.
Then the memory check: benchmarks/memory.py (gradient checkpointing, measured peak vs the cost model).
"""
from __future__ import annotations

import sys
from pathlib import Path

from vitkit.cli.main import main

RESULTS = Path(__file__).resolve().parent / "results"
FULL = [
    "bench",
    "--models", "vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224",
    "--batches", "1", "8", "32",
    "--precisions", "fp32", "bf16-autocast", "bf16",
    "--backends", "eager", "compile", "onnx", "onnx-int8",
    "--train-models", "small32", "recipe:fashion-mnist",
    "--train-batch", "128",
    "--warmup", "2", "--repeats", "7",
]

if __name__ == "__main__":
    extra = sys.argv[1:]
    name = "cpu-quick" if "--quick" in extra else "cpu"
    sys.exit(main(FULL + extra + ["--out", str(RESULTS / name)]))
