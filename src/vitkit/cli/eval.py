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
    import torch
    from torch.utils.data import ConcatDataset, DataLoader

    from ..data.datasets import Transformed, load_data, map_labels
    from ..data.transforms import eval_transform
    from ..errors import DataError
    from ..training.evaluate import evaluate, per_class
    from ..training.models import in_chans

    model = load_backend(args.checkpoint, args.backend)
    data = load_data(args.data, seed=args.seed, strict=args.strict, channels=in_chans(model))
    names = model.class_names or data.class_names
    if model.num_classes != len(names):
        raise DataError(f"{args.checkpoint}: {model.num_classes} outputs but {len(names)} classes in {args.data}")
    map_labels(data, names)
    splits = {"test": data.test, "val": data.val, "train": data.train}
    if args.split == "all":
        ds, split = ConcatDataset([s for s in splits.values() if s is not None]), "all"
    else:
        split = args.split or next((k for k in ("test", "val") if splits[k] is not None), "train")
        ds = splits[split]
        if ds is None:
            raise DataError(f"{args.data} has no {split} split")
    loader = DataLoader(Transformed(ds, eval_transform(model.preprocess), deterministic=False),
                        batch_size=args.batch_size)
    res = evaluate(model, loader, len(names), torch.device("cpu"))
    out = {"checkpoint": str(args.checkpoint), "data": data.name, "split": split, "count": res["count"],
           "top1": res["top1"], "top5": res["top5"], "loss": res["loss"],
           "per_class": per_class(res["confusion"], names), "class_names": names,
           "confusion": res["confusion"].tolist(), "skipped_images": data.info.get("num_skipped", 0)}

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
