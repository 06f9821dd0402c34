"""ViT-S/16 training steps (batch 32, bf16 autocast) against timm: the large-model training target.

Kept apart from run.py because one step is seconds long. Writes benchmarks/results/train-vits.{md,json}.
"""
from __future__ import annotations

import sys
from pathlib import Path

from vitkit.cli.main import main

RESULTS = Path(__file__).resolve().parent / "results"

if __name__ == "__main__":
    sys.exit(main(["bench", "--models", "--backends", "eager", "compile", "--train-models", "vit_small_patch16_224",
                   "--train-batch", "32", "--train-precisions", "bf16-autocast", "--warmup", "1", "--repeats", "5",
                   *sys.argv[1:], "--out", str(RESULTS / "train-vits")]))
