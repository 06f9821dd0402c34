"""`make bench`: vitkit against timm on the CPU, side by side in one process per part.

Writes benchmarks/results/cpu-<part>.{md,json}; BENCHMARKS.md quotes those files. Each file records the CPU
kind, its instruction sets and the fast paths vitkit took (vitkit.hardware; `vitkit doctor` explains them), so
results from different machine kinds can be told apart. The standard profile
takes about 30 minutes on the project's 2-core machines (run it idle; the peers part alone 15); `--full` adds batch 32, the
remaining backends and compile cases (1-2 hours). Extra arguments go to every `vitkit bench` call,
e.g. `--quick` for a smoke run.
"""
from __future__ import annotations

import sys
from pathlib import Path

from vitkit.cli.main import main

RESULTS = Path(__file__).resolve().parent / "results"
COMMON = ["--warmup", "2", "--repeats", "7"]
STANDARD = {
    # overhead-bound and mid-size inference, every precision and backend
    "infer-small": ["--models", "vit_tiny_patch16_224", "vit_small_patch16_224", "--batches", "1", "8",
                    "--precisions", "fp32", "bf16-autocast", "bf16", "--backends", "eager", "onnx", "onnx-int8",
                    "--train-models"],
    # large-model efficiency: fraction of the measured matmul peak
    "infer-base": ["--models", "vit_base_patch16_224", "--batches", "8", "--precisions", "fp32", "bf16",
                   "--backends", "eager", "--train-models"],
    "compile": ["--models", "vit_tiny_patch16_224", "--batches", "8", "--precisions", "fp32", "bf16",
                "--backends", "compile", "--train-models"],
    # the runtimes a user would pick instead (timm + compile, OpenVINO called directly) and vitkit's auto runner
    "peers": ["--models", "vit_small_patch16_224", "vit_base_patch16_224", "--batches", "1", "8",
              "--precisions", "fp32", "bf16", "--backends", "eager", "compile", "openvino", "runner", "--train-models"],
    # training steps: the small models (overhead-bound) and ViT-S/16 (compute-bound)
    "train-small": ["--models", "--train-models", "small32", "recipe:fashion-mnist", "--train-batch", "128",
                    "--train-precisions", "fp32", "bf16-autocast"],
    "train-s16": ["--models", "--train-models", "vit_small_patch16_224", "--train-batch", "32",
                  "--train-precisions", "bf16-autocast", "--repeats", "5"],
}
FULL = {"full": ["--models", "vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224",
                 "--batches", "1", "8", "32", "--precisions", "fp32", "bf16-autocast", "bf16",
                 "--backends", "eager", "compile", "onnx", "onnx-int8",
                 "--train-models", "small32", "recipe:fashion-mnist", "--train-batch", "128"]}

if __name__ == "__main__":
    extra = [a for a in sys.argv[1:] if a != "--full"]
    parts = FULL if "--full" in sys.argv[1:] else STANDARD
    only = [a for a in extra if a in parts]
    extra = [a for a in extra if a not in parts]
    rc = 0
    for name, args in parts.items():
        if only and name not in only:
            continue
        suffix = "-quick" if "--quick" in extra else ""
        rc |= main(["bench", *COMMON, *args, *extra, "--out", str(RESULTS / f"cpu-{name}{suffix}")])
    sys.exit(rc)
