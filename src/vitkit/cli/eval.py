"""`vitkit eval CKPT --data ...`: top-1/top-5, per-class precision/recall and the confusion matrix."""
from __future__ import annotations

from .common import add_json, emit, load_backend, positive_int, print_table


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a checkpoint on a dataset (top-1/5, per-class precision/recall)")
    p.add_argument("checkpoint", help="any checkpoint vitkit can load (a run's best.safetensors, ...)")
    p.add_argument("--data", default="digits", help="digits | fashion-mnist | FOLDER | MANIFEST.csv")
    p.add_argument("--split", choices=["test", "val", "train", "all"], default=None,
                   help="which split (default: test, else val, else everything in the folder/CSV)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split (as in training)")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--strict", action="store_true", help="stop at the first unreadable image")
    p.add_argument("--backend", choices=["torch", "onnx"], default="torch",
                   help="onnx: CHECKPOINT is an .onnx file from `vitkit export`, run in ONNX Runtime")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..inference import evaluate_on

    model = load_backend(args.checkpoint, args.backend)
    out = {"checkpoint": str(args.checkpoint)} | evaluate_on(model, args.data, split=args.split, seed=args.seed,
                                                             batch_size=args.batch_size, strict=args.strict)
    names = out["class_names"]

    def render(d):
        print_table(f"{d['checkpoint']} on {d['data']} ({d['split']}, {d['count']} images)",
                    ["class", "precision %", "recall %", "support"],
                    [(c["class"], f"{c['precision']:.1f}", f"{c['recall']:.1f}", c["support"]) for c in d["per_class"]])
        print(f"top-1 {d['top1']:.2f}%  top-5 {d['top5']:.2f}%  loss {d['loss']:.4f}")
        print("confusion (rows: true, columns: predicted):")
        for name, row in zip(names, d["confusion"]):
            print(f"  {name[:12]:>12} " + " ".join(f"{v:5d}" for v in row))

    emit(args, out, render)
    return 0
