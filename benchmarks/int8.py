"""int8 dynamic quantisation of a trained model: top-1 change beside the speed-up (as `vitkit export --int8`).

Usage: python benchmarks/int8.py CKPT [--data fashion-mnist]
(the shipped model: runs/fashion-mnist/best.safetensors from `vitkit train --recipe fashion-mnist`).
Writes benchmarks/results/int8.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from vitkit.api import load_model
from vitkit.export.int8 import int8_report
from vitkit.export.onnx import export_onnx

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", default="fashion-mnist")
    args = p.parse_args()
    model = load_model(args.checkpoint).eval()
    with tempfile.TemporaryDirectory() as tmp:  # what `vitkit export CKPT --int8 --eval-data DATA` does
        report = export_onnx(model, Path(tmp) / "model.onnx") | {"checkpoint": args.checkpoint}
        report["int8"] = int8_report(model, Path(tmp) / "model.onnx", eval_data=args.data)
    q, top1 = report["int8"], report["int8"]["accuracy"]["top1"]
    command = f"python benchmarks/int8.py {args.checkpoint} --data {args.data}"
    lines = [f"Command: `{command}`", "",
             ("| checkpoint | data | images | top-1 PyTorch | top-1 ONNX fp32 | top-1 int8 | change | "
             "int8 speed-up vs fp32 ONNX (batch 8) |"), "|---|---|---:|---:|---:|---:|---:|---:|",
             (f"| {args.checkpoint} | {args.data} | {q['accuracy']['count']} | {top1['pytorch']:.2f}% | "
             f"{top1['onnx']:.2f}% | {top1['int8']:.2f}% | {q['top1_change_points']:+.2f} points | "
             f"{q['speedup_vs_fp32_onnx']:.2f}x |"), ""]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "int8.md").write_text("\n".join(lines))
    (RESULTS / "int8.json").write_text(json.dumps({"command": command} | report, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
