"""On a GPU: ViT-B/16 bf16 inference and training steps, vitkit against timm on the same device.

One prepared command for a lent GPU machine (about 5 minutes); writes benchmarks/results/gpu.{md,json}:
    python benchmarks/gpu.py
"""
from __future__ import annotations

import sys
from pathlib import Path

from vitkit.cli.main import main

RESULTS = Path(__file__).resolve().parent / "results"

if __name__ == "__main__":
    sys.exit(main([
        "bench", "--device", "cuda",
        "--models", "vit_base_patch16_224", "--batches", "64", "256",
        "--precisions", "bf16-autocast", "bf16", "--backends", "eager", "compile",
        "--train-models", "vit_base_patch16_224", "--train-batch", "128", "--train-precisions", "bf16-autocast",
        "--warmup", "3", "--repeats", "10", *sys.argv[1:], "--out", str(RESULTS / "gpu"),
    ]))
