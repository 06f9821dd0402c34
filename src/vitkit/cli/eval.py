"""`vitkit eval CKPT [--data ...]`: top-1/top-5, per-class precision/recall and the confusion matrix; with
`--protocol knn|linear` (comma-separated for several), frozen-feature evaluation (vitkit.probe): DINO's
weighted k-NN and MAE's linear probe on the pooled features, the train split as bank / probe training set;
with `--protocol seg-linear|seg-knn` on a segmentation set (canvas-digits, canvas-fashion), dense probes on the
frozen patch tokens (vitkit.training.dense_probe: DINOv2's linear head, label transfer from the nearest train
patches), reported as mIoU and pixel accuracy.
With `--zeroshot`, CKPT is a CLIP pair and its classifier is built from the data's class names in words
(vitkit.zeroshot: prompt templates, ensembled), then evaluated like any classifier.

Without `--data`, the data the checkpoint was trained on (its provenance), split as in training (seed and
validation fraction from the checkpoint, its run folder's config.json, or the recipe and command it records),
and by default its held-out split: test when the data has one, else the validation split training carved.
Scoring images the run trained on (`--split train|all`, another `--seed`) prints one warning line."""
from __future__ import annotations

import sys
from typing import Any

from ..data.splits import EVAL_SPLITS
from .common import add_data_options, add_json, data_options, emit, load_backend, positive_int, print_table
from .export import add_max_tokens, add_patch_size, add_precision, with_patch_size


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a checkpoint on a dataset (top-1/5, per-class precision/recall)")
    p.add_argument("checkpoint", help="any checkpoint vitkit can load (a run folder, its best.safetensors, "
                   "bundled:NAME, a pretrained name.tag, an exported .onnx)")
    p.add_argument("--data", default=None, help="digits | fashion-mnist | FOLDER | MANIFEST.csv (default: the data "
                   "the checkpoint was trained on)")
    p.add_argument("--split", choices=list(EVAL_SPLITS), default=None,
                   help="which split (default: test, else val, else everything in the folder/CSV); val is the "
                   "training run's validation split, carved again from its seed and fraction")
    p.add_argument("--seed", type=int, default=None, help="seed of the split (default: the training run's)")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--strict", action="store_true", help="stop at the first unreadable image")
    p.add_argument("--backend", choices=["torch", "onnx", "openvino"], default="torch",
                   help="onnx: CHECKPOINT is an .onnx file from `vitkit export`, run in ONNX Runtime (the default "
                   "for .onnx files); openvino: an IR folder from `vitkit export --openvino`, or a checkpoint "
                   "converted on first use (cached)")
    add_precision(p)
    add_patch_size(p)
    add_max_tokens(p)
    add_data_options(p, "; default: the settings the training run recorded, when --data is its data")
    p.add_argument("--protocol", type=_protocols, default=("top1",), metavar="top1|knn|linear|seg-linear|seg-knn",
                   help="top1: the model's own classifier (default); knn: weighted k-NN on frozen features (DINO: "
                   "k=20, T=0.07, the train split as the bank); linear: a linear probe (BatchNorm + linear, MAE) "
                   "trained on the frozen train features; several comma-separated (knn,linear): one line each. "
                   "On a segmentation set (canvas-digits, canvas-fashion), reported as mIoU: seg-linear: "
                   "BatchNorm + a 1x1 conv on the frozen last feature map, its logits upsampled bilinearly to "
                   "the masks (DINOv2's linear head); seg-knn: each patch votes from its k nearest train patches "
                   "(cosine, exp(sim / T) weights, a train patch labelled by its majority pixel)")
    p.add_argument("--k", type=positive_int, default=20, help="knn, seg-knn: neighbours (default 20)")
    p.add_argument("--knn-t", type=float, default=0.07, help="knn, seg-knn: temperature of the exp(sim / T) votes")
    p.add_argument("--probe-epochs", type=positive_int, default=90,
                   help="linear, seg-linear: epochs of the probe (default 90)")
    p.add_argument("--probe-seed", type=int, default=0, help="linear, seg-linear: seed of the probe's init and order")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="seg-linear, seg-knn: the first N images of the train split and of the scored split at "
                   "most (quick runs; the features of both are held in memory)")
    p.add_argument("--zeroshot", action="store_true",
                   help="CKPT is a CLIP pair: classify by the class names in words (needs --data; --labels gives "
                   "the words for the data's classes, in their order, when the names are not words)")
    from .zeroshot import add_zeroshot_args

    add_zeroshot_args(p, labels_required=False)
    add_json(p)
    p.set_defaults(func=run)


def _protocols(text: str) -> tuple[str, ...]:
    import argparse

    from ..probe import PROTOCOLS
    from ..training.dense_probe import DENSE_PROTOCOLS

    known = (*PROTOCOLS, *DENSE_PROTOCOLS)
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown protocol(s) {bad or [text]}; choose from {', '.join(known)}")
    return names


def run(args) -> int:
    from ..data.builtin import DETECTION, SEGMENTATION, dataset_task
    from ..data.datasets import same_data
    from ..errors import ConfigError
    from ..inference import evaluate_on, training_data
    from ..training.dense_probe import DENSE_PROTOCOLS

    dense = [p for p in args.protocol if p in DENSE_PROTOCOLS]
    if dense and len(dense) != len(args.protocol):  # masks and image labels are different data
        raise ConfigError(f"--protocol {','.join(dense)} scores masks and "
                          f"{','.join(p for p in args.protocol if p not in dense)} image labels: run them separately")
    if args.limit is not None and not dense:
        raise ConfigError("--limit applies to --protocol seg-linear|seg-knn only")
    from .predict import eval_detector

    detected = None if args.zeroshot or dense else eval_detector(args)  # a task=detect run: its COCO mAP
    if detected is not None:
        return detected
    model = _zeroshot_model(args) if args.zeroshot else with_patch_size(
        load_backend(args.checkpoint, args.backend, args.precision, batch_size=args.batch_size), args)
    prov = getattr(model, "provenance", None) or (getattr(model, "meta", None) or {}).get("provenance") or {}
    trained = training_data(str(args.checkpoint), prov)
    data = args.data or trained["data"]
    if not data:  # vitkit's first default, kept, but said
        from ..weights.notes import note_once

        data = "digits"
        note_once(f"{args.checkpoint} does not record the data it was trained on: evaluating on digits "
                  "(pass --data digits | fashion-mnist | FOLDER | MANIFEST.csv)")
    if not dense and dataset_task(data) in (SEGMENTATION, DETECTION):  # masks or boxes, not one label per image
        kind, task, metrics = (("segmentation", "segment", "mIoU and pixel accuracy") if dataset_task(data) == SEGMENTATION
                               else ("detection", "detect", "COCO mAP"))
        dense_hint = " (or frozen patch features: --protocol seg-linear|seg-knn)" if kind == "segmentation" else ""
        raise ConfigError(f"{data} is a {kind} dataset: vitkit eval scores classifiers{dense_hint}; a task={task} run "
                          f"reports its {metrics} in its report.md")
    same = args.data is None or same_data(args.data, trained["data"])  # the run's own data: split as it was
    seed = args.seed if args.seed is not None else (trained["seed"] if same and trained["seed"] is not None else 0)
    val_fraction = (trained["val_fraction"] if same else None) or 0.0
    training = trained if same else None
    # the data source's settings: --set data.KEY=VALUE, else the run's own when this is its data (shards read
    # with another label key, a datasets folder with other columns, would be other labels)
    options = data_options(args) or (trained["options"] if same else None)
    data_from = "--data" if args.data else trained["from"]
    if dense:
        return _run_dense_protocols(args, model, data, seed, val_fraction, data_from, options)
    if tuple(args.protocol) != ("top1",):
        return _run_protocols(args, model, data, seed, val_fraction, data_from, training, options)
    out = {"checkpoint": str(args.checkpoint)} | evaluate_on(model, data, split=args.split, seed=seed,
                                                             val_fraction=val_fraction, batch_size=args.batch_size,
                                                             strict=args.strict, training=training, options=options)
    out |= {"seed": seed, "val_fraction": val_fraction, "data_from": data_from, "data_options": options or {}}
    _warn(out["warnings"])
    if args.zeroshot:
        out["zeroshot"] = model.provenance["zeroshot"]
    names = out["class_names"]

    def render(d):
        print_table(f"{d['checkpoint']} on {d['data']} ({d['split']}, {d['count']} images)",
                    ["class", "precision %", "recall %", "support"],
                    [(c["class"], f"{c['precision']:.1f}", f"{c['recall']:.1f}", c["support"]) for c in d["per_class"]])
        print(f"{_scored(d)}\ntop-1 {d['top1']:.2f}%  top-5 {d['top5']:.2f}%  loss {d['loss']:.4f}")
        if d.get("data_options"):
            print("data settings: " + ", ".join(f"data.{k}={v}" for k, v in d["data_options"].items())
                  + ("" if args.data_options else f" (from {d['data_from']})"))
        if d.get("zeroshot"):
            z = d["zeroshot"]
            print(f"zero-shot: {z['num_templates']} template(s) per class ({z['templates']}), prompts: "
                  + ", ".join(z["prompts"][:10]) + (" ..." if len(z["prompts"]) > 10 else ""))
        if len(names) <= 30:
            print("confusion (rows: true, columns: predicted):")
            for name, row in zip(names, d["confusion"]):
                print(f"  {name[:12]:>12} " + " ".join(f"{v:5d}" for v in row))

    emit(args, out, render)
    return 0


def _scored(d: dict[str, Any]) -> str:
    """'val split: 10 images held out from training (carved from train: 15% of each class, seed 0)'."""
    held = " held out from training" if d.get("trained_images") == 0 else ""
    return f"{d['split']} split: {d['count']} images{held} ({d['split_from']})"


def _warn(warnings: list[str]) -> None:
    """Each warning as one stderr line, in JSON mode too (stdout stays the JSON document)."""
    for line in warnings:
        print(f"vitkit eval: warning: {line}", file=sys.stderr)


def _run_protocols(args, model, data: str, seed: int, val_fraction: float, data_from: str,
                   training: dict[str, Any] | None, options: dict[str, Any] | None) -> int:
    """`--protocol knn,linear[,top1]`: one line per protocol (or one JSON object)."""
    from ..errors import ConfigError
    from ..inference import evaluate_on
    from ..probe import probe_on

    frozen = [p for p in args.protocol if p != "top1"]
    if not hasattr(model, "forward_features"):
        raise ConfigError(f"--protocol {','.join(frozen)} needs the model's features: use a torch checkpoint, "
                          "not an ONNX file")
    out: dict[str, Any] = {"checkpoint": str(args.checkpoint), "protocols": list(args.protocol), "seed": seed,
                           "val_fraction": val_fraction, "data_from": data_from, "data_options": options or {}}
    if "top1" in args.protocol:
        res = evaluate_on(model, data, split=args.split, seed=seed, val_fraction=val_fraction,
                          batch_size=args.batch_size, strict=args.strict, training=training, options=options)
        out |= {"data": res["data"], "split": res["split"], "count": res["count"],
                "top1": {"top1": res["top1"], "top5": res["top5"], "loss": res["loss"]}}
        _warn(res["warnings"])
    res = probe_on(model, data, frozen, split=args.split, seed=seed, val_fraction=val_fraction,
                   batch_size=args.batch_size, strict=args.strict, k=args.k, T=args.knn_t,
                   epochs=args.probe_epochs, probe_seed=args.probe_seed, options=options)
    out |= {k: v for k, v in res.items() if k not in out or k in frozen}

    def render(d):
        where = f"on {d['data']} {d['split']} ({d['count']} images)"
        for p in d["protocols"]:
            r = d[p]
            how = {"top1": "the model's classifier",
                   "knn": f"k={r.get('k')}, T={r.get('T')}, bank: {d.get('bank_split')} ({d.get('bank_count')} images)",
                   "linear": f"BatchNorm + linear on frozen features, {r.get('epochs')} epochs, seed {r.get('seed')}"}[p]
            print(f"{p}: top-1 {r['top1']:.2f}%  top-5 {r['top5']:.2f}%  {where} [{how}]")

    emit(args, out, render)
    return 0


def _run_dense_protocols(args, model, data: str, seed: int, val_fraction: float, data_from: str,
                         options: dict[str, Any] | None) -> int:
    """`--protocol seg-linear[,seg-knn]`: one line per protocol (or one JSON object)."""
    from ..training.dense_probe import dense_probe_on

    out: dict[str, Any] = {"checkpoint": str(args.checkpoint), "protocols": list(args.protocol), "seed": seed,
                           "val_fraction": val_fraction, "data_from": data_from, "data_options": options or {}}
    out |= dense_probe_on(model, data, args.protocol, split=args.split, seed=seed, val_fraction=val_fraction,
                          strict=args.strict, options=options, batch_size=args.batch_size, limit=args.limit, k=args.k, T=args.knn_t,
                          epochs=args.probe_epochs, probe_seed=args.probe_seed)

    def render(d):
        grid = "x".join(map(str, d["grid"]))
        where = f"on {d['data']} {d['split']} ({d['count']} images)"
        for p in d["protocols"]:
            r = d[p]
            how = {"seg-linear": f"BatchNorm + 1x1 conv on frozen {grid} patch tokens, logits upsampled to "
                                 f"{'x'.join(map(str, d['mask_size']))}, {r.get('epochs')} epochs, seed {r.get('seed')}",
                   "seg-knn": f"k={r.get('k')}, T={r.get('T')} over {grid} patch tokens, bank: {d['bank_split']} "
                              f"({d['bank_count']} images, {d['bank_patches']} patches)"}[p]
            print(f"{p}: mIoU {r['miou']:.2f}% (items {r['miou_fg']:.2f}%)  pixel acc {r['pixel_acc']:.2f}%  "
                  f"{where} [{how}]")

    emit(args, out, render)
    return 0


def _zeroshot_model(args):
    """`--zeroshot`: the CLIP pair with the classifier for the data's classes (their names, or --labels in their
    order) as its head, the data's class names as its class names."""
    from ..data.datasets import load_data
    from ..errors import ConfigError
    from ..zeroshot import load_templates, parse_labels
    from .zeroshot import load_zeroshot

    if args.backend != "torch" or str(args.checkpoint).lower().endswith(".onnx"):
        raise ConfigError("--zeroshot needs the CLIP pair's text tower in PyTorch: give its checkpoint, with "
                          "--backend torch")
    if not args.data:
        raise ConfigError("--zeroshot needs --data (digits | fashion-mnist | FOLDER | MANIFEST.csv): a CLIP pair "
                          "was not trained on a labelled set to default to")
    load_templates(args.templates)  # a bad template file is refused before anything is read
    names = load_data(args.data, strict=args.strict, options=data_options(args)).class_names
    prompts = parse_labels(args.labels) if args.labels else names
    if len(prompts) != len(names):
        raise ConfigError(f"--labels gives {len(prompts)} names, {args.data} has {len(names)} classes "
                          f"({', '.join(names[:10])}{' ...' if len(names) > 10 else ''}): one per class, in that order")
    model = load_zeroshot(args, prompts)
    model.class_names = list(names)  # the data's names, so its labels map onto the classifier's rows
    model.provenance["zeroshot"]["prompts"] = list(prompts)
    return model
