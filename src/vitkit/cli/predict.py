"""`vitkit predict CKPT IMAGE...`: top-k labels with probabilities, preprocessed as the checkpoint says."""
from __future__ import annotations

import sys

from .common import add_json, emit, load_backend, positive_int, print_table
from .export import add_patch_size, add_precision, with_patch_size


def register(sub) -> None:
    p = sub.add_parser("predict", help="classify image files with a checkpoint (top-k with probabilities)")
    p.add_argument("checkpoint", help="any checkpoint vitkit can load")
    p.add_argument("images", nargs="+", help="image files (any format Pillow reads)")
    p.add_argument("--top-k", type=positive_int, default=3)
    p.add_argument("--backend", choices=["torch", "onnx", "openvino"], default="torch",
                   help="onnx: CHECKPOINT is an .onnx file from `vitkit export`, run in ONNX Runtime; openvino: an IR "
                   "folder from `vitkit export --openvino`, or a checkpoint converted on first use (cached)")
    add_precision(p)
    add_patch_size(p)
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..inference import input_note, predict_files

    model = with_patch_size(load_backend(args.checkpoint, args.backend, args.precision), args)
    preds, errors = predict_files(model, args.images, args.top_k)
    note = input_note(model, preds)
    if note:  # once per command, on stderr: --json stdout stays pure JSON
        print(note, file=sys.stderr)

    def render(d):
        rows = [(p["image"], ", ".join(f"{t['label']} {100 * t['prob']:.1f}%" for t in p["top"])) for p in d["predictions"]]
        if rows:
            print_table(f"predictions ({args.checkpoint})", ["image", f"top-{args.top_k}"], rows, justify=["left", "left"])

    emit(args, {"checkpoint": str(args.checkpoint), "predictions": preds, "errors": errors}, render)
    for e in errors:  # one line per broken file, whatever the output format
        print(f"vitkit predict: error: {e['error']}", file=sys.stderr)
    return 2 if errors else 0
