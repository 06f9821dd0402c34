"""Dense prediction across backbones, as docs/dense.md compares them: the same task and data for a plain ViT
with ViTDet's simple pyramid, a small Swin, ResNet-18 (torchvision's FPN for detection) and a hybrid (the same
ViT with a conv stem for its patch embedding), first at the same number of epochs, then at the same wall
budget (`time_budget_s`: the planner sizes each run's steps to the budget, evaluations included).

Each run is the real CLI (`vitkit train --task detect|segment`) in its own run folder; the table reads each
run's summary.json. For detection, a trivial baseline is scored with the same COCOeval: every test image gets,
for every class, one box of that class's mean training size at the mean training centre, scored by the
class's frequency (what a detector that never looks at the pixels can do).

Usage: python benchmarks/dense_compare.py --task detect [--data canvas-digits-boxes] [--epochs 4]
       [--budget-s 150] [--backbones vit,swin,resnet,hybrid] [--runs DIR] [--threads 2]
       python benchmarks/dense_compare.py --task segment --data canvas-fashion --epochs 1 --budget-s 240
Writes benchmarks/results/dense-compare-TASK-DATA.{md,json}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from vitkit.bench import machine_info

RESULTS = Path(__file__).resolve().parent / "results"
VIT = ["--set", "model.depth=4", "--set", "model.embed_dim=96", "--set", "model.num_heads=3"]
BACKBONES = {  # (what the row says, the model and its settings; img_size and in_chans follow the data)
    "vit": ("ViT 96/4/3, patch 4, simple pyramid", ["--model", "vit_tiny_patch4_28", *VIT]),
    "swin": ("Swin 32, depths 2-2-2-2, window 4", ["--model", "swin_tiny_patch4_window7_224", "--set",
                                                    "model.embed_dim=32", "--set", "model.depths=[2,2,2,2]",
                                                    "--set", "model.num_heads=[1,2,4,8]", "--set",
                                                    "model.window_size=4"]),
    "resnet": ("ResNet-18, ImageNet stem", ["--model", "resnet18", "--set", "model.small_stem=false"]),
    "hybrid": ("hybrid: the ViT with a conv stem", ["--model", "vit_tiny_conv_32", *VIT]),
}
COMMON = ["--set", "ema=false", "--set", "batch_size=64", "--set", "lr=2e-3", "--set", "warmup_epochs=0.5",
          "--set", "crop=none", "--set", "reprob=0", "--set", "in_chans=1", "--quiet"]


def params_of(run: Path) -> tuple[int, int]:
    """(backbone parameters, head parameters) from the run's safetensors files."""
    from safetensors import safe_open

    def count(path: Path) -> int:
        if not path.is_file():
            return 0
        with safe_open(str(path), "pt") as f:
            return sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())

    head = next((p for p in (run / "detection_head.safetensors", run / "segmentation_head.safetensors") if p.is_file()),
                run / "none")
    return count(run / "last.safetensors"), count(head)


def _numel(shape) -> int:
    n = 1
    for v in shape:
        n *= int(v)
    return n


def train(task: str, data: str, size: int, backbone: str, extra: list[str], out: Path, threads: int) -> dict:
    argv = [sys.executable, "-m", "vitkit", "train", "--data", data, "--task", task, *BACKBONES[backbone][1],
            *(["--set", f"img_size={size}"] if backbone != "resnet" else []), *COMMON,
            "--set", f"threads={threads}", *extra, "--out", str(out), "--overwrite"]
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{backbone}: {' '.join(map(shlex.quote, argv))} failed:\n{res.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    backbone_params, head_params = params_of(out)
    keys = ("map", "map_50", "map_75") if task == "detect" else ("miou", "miou_fg", "pixel_acc")
    return {"backbone": backbone, "what": BACKBONES[backbone][0], "params": backbone_params, "head_params": head_params,
            "epochs": summary["epochs"], "steps": summary["steps"], "wall_s": round(summary["wall_time_s"], 1),
            "process_s": round(time.perf_counter() - t0, 1), "split": summary["final"]["split"],
            **{k: summary["final"].get(k) for k in keys},
            "command": "vitkit " + " ".join(map(shlex.quote, argv[3:])).replace(str(out), out.name)}


def prior_baseline(data: str) -> dict:
    """COCO mAP of the boxes a detector that ignores the pixels would give (module docstring)."""
    import torch

    from vitkit.data.datasets import load_data
    from vitkit.training.tasks.detect import coco_ground_truth, coco_metrics

    bundle = load_data(data)
    train_boxes = torch.cat(bundle.train.boxes)  # [n, 4] xyxy
    train_labels = torch.cat(bundle.train.box_labels)  # [n]
    classes = sorted(set(train_labels.tolist()))
    results, targets = [], []
    for i in range(len(bundle.test)):
        boxes, labels = bundle.test.boxes[i], bundle.test.box_labels[i]
        targets.append({"boxes": boxes, "labels": labels, "crowd": torch.zeros(len(boxes), dtype=torch.bool),
                        "area": (boxes[:, 2:] - boxes[:, :2]).prod(1), "size": torch.tensor(bundle.test.sizes[i]),
                        "image_id": torch.tensor(bundle.test.image_ids[i])})
        for c in classes:
            mine = train_boxes[train_labels == c]  # [m, 4]
            centre, wh = ((mine[:, :2] + mine[:, 2:]) / 2).mean(0), (mine[:, 2:] - mine[:, :2]).mean(0)
            box = torch.cat([centre - wh / 2, centre + wh / 2]).tolist()
            results.append({"image_id": bundle.test.image_ids[i], "category_id": int(c),
                            "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                            "score": float(len(mine) / len(train_labels))})
    metrics = coco_metrics(coco_ground_truth(targets, max(classes) + 1), results)
    return {k: round(metrics[k], 2) for k in ("map", "map_50", "map_75")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=["detect", "segment"], required=True)
    ap.add_argument("--data", default=None)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--backbones", default="vit,swin,resnet,hybrid")
    ap.add_argument("--runs", default="runs/dense-compare")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    data = args.data or {"detect": "canvas-digits-boxes", "segment": "canvas-digits"}[args.task]
    from vitkit.data.canvas import spec_of

    size = spec_of(data).size
    runs = Path(args.runs) / f"{args.task}-{data}"
    rows = []
    for setting, extra in (("epochs", ["--epochs", str(args.epochs)]),
                           ("wall", ["--epochs", "1000", "--set", f"time_budget_s={args.budget_s:g}"])):
        for b in args.backbones.split(","):
            row = train(args.task, data, size, b, extra, runs / f"{b}-{setting}", args.threads) | {"setting": setting}
            print(json.dumps(row), flush=True)
            rows.append(row)
    baseline = prior_baseline(data) if args.task == "detect" else None
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")
    info = {"task": args.task, "data": data, "epochs": args.epochs, "budget_s": args.budget_s, "date": stamp,
            "machine": machine_info(), "command": "python " + " ".join(map(shlex.quote, sys.argv)),
            "baseline": baseline, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    name = f"dense-compare-{args.task}-{data}"
    (RESULTS / f"{name}.json").write_text(json.dumps(info, indent=1))
    cols = ("mAP", "mAP50", "mAP75") if args.task == "detect" else ("mIoU", "items mIoU", "pixel acc")
    keys = ("map", "map_50", "map_75") if args.task == "detect" else ("miou", "miou_fg", "pixel_acc")
    lines = [f"{args.task} on {data} ({size} px), {stamp}; `{info['command']}`", "",
             f"| backbone (params + head) | epochs | steps | test {' | test '.join(cols)} | wall |",
             "|---|---:|---:|" + "---:|" * len(cols) + "---:|"]
    for r in rows:
        scores = " | ".join(f"{r[k]:.2f}" if isinstance(r[k], int | float) else str(r[k]) for k in keys)
        lines.append(f"| {r['what']} ({r['params'] / 1e6:.2f}M + {r['head_params'] / 1e6:.2f}M) | {r['epochs']} | "
                     f"{r['steps']} | {scores} | {r['wall_s']:.0f} s |")
    if baseline:
        lines.append(f"| trivial baseline: each class's mean training box, scored by its frequency | - | - | "
                     f"{baseline['map']:.2f} | {baseline['map_50']:.2f} | {baseline['map_75']:.2f} | - |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
