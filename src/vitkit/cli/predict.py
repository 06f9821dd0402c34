"""`vitkit predict CKPT IMAGE...`: top-k labels with probabilities, preprocessed as the checkpoint says; with a
detection run's checkpoint (a `detection_head.safetensors` beside it, or its ONNX export), each image's boxes
(label, score, x0 y0 x1 y1 in the image's pixels): `--out DIR` draws them, `--json FILE` writes COCO's results
format (image ids and category ids from `--coco ANN.json` when given)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import emit, load_backend, positive_int, print_table
from .export import add_max_tokens, add_patch_size, add_precision, with_patch_size


def register(sub) -> None:
    p = sub.add_parser("predict", help="classify image files with a checkpoint (top-k with probabilities), or "
                       "find boxes with a detection run's")
    p.add_argument("checkpoint", help="any checkpoint vitkit can load; a task=detect run (its folder or a checkpoint "
                   "beside its detection_head.safetensors) detects")
    p.add_argument("images", nargs="+", help="image files (any format Pillow reads)")
    p.add_argument("--top-k", type=positive_int, default=3)
    p.add_argument("--backend", choices=["torch", "onnx", "openvino"], default="torch",
                   help="onnx: CHECKPOINT is an .onnx file from `vitkit export`, run in ONNX Runtime; openvino: an IR "
                   "folder from `vitkit export --openvino`, or a checkpoint converted on first use (cached)")
    add_precision(p)
    add_patch_size(p)
    add_max_tokens(p)
    p.add_argument("--json", nargs="?", const=True, default=False, metavar="FILE",
                   help="machine-readable output on stdout; with FILE (a detector): the detections in COCO's results "
                   "format (image_id, category_id, bbox [x, y, w, h], score), written to FILE")
    p.add_argument("--coco", metavar="ANN.json", help="detector, with --json FILE: image ids (matched by file_name) and "
                   "category ids from this COCO annotation file (default: 1, 2, ... in the order given, and the labels)")
    p.add_argument("--out", metavar="DIR", help="detector: write each image with its boxes drawn to DIR/NAME.png")
    p.add_argument("--score-threshold", type=_unit_interval, default=None, metavar="S",
                   help="detector: keep boxes scoring at least S (default 0: all the detector keeps, which stops at "
                   "its own task.score_thresh, 0.05 unless the run set it)")
    p.set_defaults(func=run)


def _unit_interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return v


def run(args) -> int:
    from ..errors import ConfigError
    from ..inference import detection_head_of, load_detector

    detector = None
    if args.backend == "torch" and not str(args.checkpoint).lower().endswith(".onnx"):
        detector = load_detector(args.checkpoint)
    elif args.backend == "openvino" and detection_head_of(args.checkpoint) is not None:
        raise ConfigError(f"{args.checkpoint} is a detector: it runs in PyTorch, or in ONNX Runtime once exported "
                          "(vitkit export --onnx), not in OpenVINO")
    model = detector if detector is not None else load_backend(args.checkpoint, args.backend, args.precision)
    if getattr(model, "detects", False):
        if args.patch_size:
            raise ConfigError("--patch-size applies to classifiers: a detector runs at the size it was trained at")
        from ..inference import as_detector

        return _detect(args, as_detector(model))
    detector_only = [flag for flag, given in (("--json FILE", isinstance(args.json, str)), ("--coco", args.coco),
                                              ("--out", args.out), ("--score-threshold", args.score_threshold is not None))
                     if given]
    if detector_only:
        raise ConfigError(f"{', '.join(detector_only)}: detection output, and {args.checkpoint} is a classifier (no "
                          "detection_head.safetensors beside it); --json alone prints its top-k as JSON")
    return _classify(args, with_patch_size(model, args))


def _classify(args, model) -> int:
    from ..inference import input_note, predict_files

    preds, errors = predict_files(model, args.images, args.top_k)
    note = input_note(model, preds)
    if note:  # once per command, on stderr: --json stdout stays pure JSON
        print(note, file=sys.stderr)

    def render(d):
        rows = [(p["image"], ", ".join(f"{t['label']} {100 * t['prob']:.1f}%" for t in p["top"])) for p in d["predictions"]]
        if rows:
            print_table(f"predictions ({args.checkpoint})", ["image", f"top-{args.top_k}"], rows, justify=["left", "left"])

    emit(args, {"checkpoint": str(args.checkpoint), "predictions": preds, "errors": errors}, render)
    return _said(errors)


def _detect(args, detector) -> int:
    """Boxes per image: a table, or JSON on stdout (--json), or COCO results in a file (--json FILE)."""
    import json

    from .._files import atomic_write_text
    from ..errors import ConfigError
    from ..inference import coco_detections, coco_image_ids, detect_files, draw_detections, input_note

    results_file = args.json if isinstance(args.json, str) else None
    if args.coco and results_file is None:
        raise ConfigError("--coco gives the image and category ids of a results file: add --json FILE")
    if args.out:
        stems = [Path(p).stem for p in args.images]
        twice = sorted({s for s in stems if stems.count(s) > 1})
        if twice:  # DIR/NAME.png: one drawing would overwrite the other
            raise ConfigError(f"--out {args.out}: several images are named {', '.join(twice[:3])}; drawings are "
                              "written as DIR/NAME.png, so give images with distinct names")
    preds, errors = detect_files(detector, args.images, args.score_threshold or 0.0)
    results = None
    if results_file is not None:  # ids checked before anything is written
        results = coco_detections(preds, *coco_image_ids(preds, detector, args.coco))
    note = input_note(detector, preds)
    if note:
        print(note, file=sys.stderr)
    if args.out:
        from ..data.images import load_image
        from ..training.models import in_chans

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for p in preds:
            draw_detections(load_image(p["image"], in_chans(detector)), p["boxes"], out / f"{Path(p['image']).stem}.png")
    if results is not None:
        atomic_write_text(results_file, json.dumps(results))

    def render(d):
        rows = [(p["image"], b["label"], f"{b['score']:.3f}", " ".join(f"{v:.1f}" for v in b["box"]))
                for p in d["predictions"] for b in p["boxes"]]
        print_table(f"detections ({args.checkpoint})", ["image", "label", "score", "x0 y0 x1 y1"], rows,
                    justify=["left", "left", "right", "right"])
        empty = [p["image"] for p in d["predictions"] if not p["boxes"]]
        if empty:
            print(f"no boxes in: {', '.join(empty)}")
        if results_file is not None:
            print(f"wrote {len(results)} detection(s) in COCO's results format to {results_file}")
        if args.out:
            print(f"drew the boxes of {len(preds)} image(s) in {args.out}")

    payload = {"checkpoint": str(args.checkpoint), "task": "detect", "predictions": preds, "errors": errors}
    if results_file is not None:
        args.json = False  # stdout: the table; the JSON went to the file
    emit(args, payload, render)
    return _said(errors)


def _said(errors) -> int:
    for e in errors:  # one line per broken file, whatever the output format
        print(f"vitkit predict: error: {e['error']}", file=sys.stderr)
    return 2 if errors else 0


def eval_detector(args) -> int | None:
    """`vitkit eval DET_CKPT [--data ANN.json]`: COCO mAP of a detection run's detector (None when the checkpoint
    is not one, and eval goes on as for a classifier). Without --data, the run's own data and held-out split."""
    from ..data.datasets import same_data
    from ..errors import ConfigError
    from ..inference import evaluate_detector_on, load_detector, training_data

    if tuple(args.protocol) != ("top1",):
        return None
    if args.backend == "onnx" or str(args.checkpoint).lower().endswith(".onnx"):
        from ..export.onnx import OnnxRunner

        if OnnxRunner(args.checkpoint).detects:
            raise ConfigError(f"{args.checkpoint} is an exported detector: vitkit eval scores a detector from its "
                              "run's checkpoint (the PyTorch one), whose ONNX export gives the same boxes")
        return None
    detector = load_detector(args.checkpoint) if args.backend == "torch" else None
    if detector is None:
        return None
    trained = training_data(str(args.checkpoint), detector.provenance)
    data = args.data or trained["data"] or "canvas-digits-boxes"
    same = args.data is None or same_data(args.data, trained["data"])
    seed = args.seed if args.seed is not None else (trained["seed"] if same and trained["seed"] is not None else 0)
    out = {"checkpoint": str(args.checkpoint), "task": "detect", "detector": detector.options["detector"]}
    out |= evaluate_detector_on(detector, data, split=args.split, seed=seed,
                                val_fraction=(trained["val_fraction"] if same else None) or 0.0,
                                batch_size=args.batch_size, strict=args.strict)

    def render(d):
        print_table(f"{d['checkpoint']} on {d['data']} ({d['split']}, {d['count']} images)", ["class", "AP %"],
                    [(name, f"{ap:.2f}") for name, ap in d["per_class"].items()])
        print(f"{d['split']} split ({d['split_from']}): COCO mAP {d['map']:.2f}  mAP50 {d['map_50']:.2f}  "
              f"mAP75 {d['map_75']:.2f}  loss {d['loss']:.4f}")

    emit(args, out, render)
    return 0
