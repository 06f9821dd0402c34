"""`vitkit export CKPT --onnx OUT.onnx` and/or `--openvino DIR`: an ONNX Runtime model or an OpenVINO IR folder
(vitkit.export.openvino), each checked against PyTorch on export.

Dynamic batch by default; `--dynamic-size` also lets H and W vary (positions resampled bilinearly in the
graph, see vitkit.export.onnx). `--int8` adds OUT.int8.onnx (dynamic quantisation, measured by
vitkit.export.int8) and, with `--eval-data`, prints its top-1 change beside its speed-up over the
fp32 graph; one warning line on stderr when int8 costs more than 0.5 top-1 points or is under 1.2x as
fast (`--int8-max-drop`, `--int8-min-speedup`).
"""
from __future__ import annotations

import sys

from .common import add_json, emit, non_negative_float, non_negative_int, positive_int, print_table


def register(sub) -> None:
    p = sub.add_parser("export", help="export a checkpoint to ONNX and/or OpenVINO (parity-checked), optionally "
                       "int8-quantised (ONNX)")
    p.add_argument("checkpoint", help="any checkpoint vitkit can load")
    p.add_argument("--onnx", metavar="OUT.onnx", help="where to write the ONNX model")
    p.add_argument("--openvino", metavar="DIR", help="where to write the OpenVINO IR folder (model.xml, model.bin, "
                   "vitkit.json); `--backend openvino` runs it")
    p.add_argument("--dynamic-size", action="store_true",
                   help="any H, W that are multiples of the patch (bilinear position resampling)")
    p.add_argument("--static-batch", action="store_true", help="fix the batch size to 2 (the export example)")
    p.add_argument("--opset", type=positive_int, default=18)
    p.add_argument("--tol", type=float, default=1e-4, help="largest logit difference allowed vs PyTorch")
    p.add_argument("--int8", action="store_true", help="also write OUT.int8.onnx (dynamic int8 quantisation)")
    p.add_argument("--eval-data", metavar="DATA",
                   help="with --int8: measure top-1 of PyTorch, ONNX fp32 and int8 on this dataset's test split "
                        "(digits | fashion-mnist | FOLDER | CSV)")
    p.add_argument("--eval-limit", type=positive_int, default=None, help="evaluate at most this many images")
    add_patch_size(p)
    p.add_argument("--int8-max-drop", type=non_negative_float, default=None, metavar="POINTS",
                   help="with --int8: warn when int8 top-1 is more than this many points below PyTorch's "
                        "(default 0.5; measured with --eval-data)")
    p.add_argument("--int8-min-speedup", type=non_negative_float, default=None, metavar="X",
                   help="with --int8: warn when int8 is less than X times as fast as the fp32 ONNX model (default 1.2)")
    add_json(p)
    p.set_defaults(func=run)


def add_patch_size(p) -> None:
    """`--patch-size` and `--merge` (predict, eval, export): the run-time knobs of a ViT checkpoint."""
    p.add_argument("--patch-size", type=positive_int, metavar="P", help="run a ViT at P-pixel patches: the patch "
                   "kernel resampled from the checkpoint's (FlexiViT's pseudo-inverse resize), positions following")
    add_merge(p)


def add_merge(p) -> None:
    p.add_argument("--merge", type=non_negative_int, default=None, metavar="R",
                   help="token merging (ToMe): R tokens merged per block on a ViT (0: none); `vitkit cost --merge R` "
                   "gives the tokens per block, `vitkit tradeoff` what it costs in accuracy")


def add_max_tokens(p) -> None:
    """`--max-tokens` (predict, eval, serve, embed): images at their own aspect ratio under a token budget."""
    p.add_argument("--max-tokens", type=positive_int, default=None, metavar="N",
                   help="native aspect ratio (NaFlex) on a ViT: each image resized, keeping its aspect ratio, to the "
                        "largest grid of at most N patches (no crop) and batched padded, the padding masked")


def with_patch_size(model, args):
    """`model` at --patch-size, --merge and --max-tokens (a PyTorch ViT; other models refused in one line), or as
    it is."""
    if getattr(args, "patch_size", None):
        from ..api import set_patch_size

        set_patch_size(model, args.patch_size)
    if getattr(args, "merge", None) is not None:
        from ..api import set_merge

        set_merge(model, args.merge)
    if getattr(args, "max_tokens", None) is not None:
        from ..api import set_max_tokens

        set_max_tokens(model, args.max_tokens)
    return model


def add_precision(p) -> None:
    """`--precision` of the OpenVINO backend (predict, eval)."""
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="with --backend openvino: f32 or bf16 inference (bf16 only where the CPU has native bf16; "
                   "auto: the machine's inference decision, `vitkit doctor`)")


def run(args) -> int:
    from ..api import load_model
    from ..errors import ConfigError
    from ..export.int8 import int8_report
    from ..export.onnx import export_onnx

    if not args.onnx and not args.openvino:
        raise ConfigError("give where to write: --onnx OUT.onnx and/or --openvino DIR")
    if not args.onnx and (args.int8 or args.dynamic_size or args.static_batch):
        raise ConfigError("--int8, --dynamic-size and --static-batch apply to --onnx")
    if not args.int8 and (args.int8_max_drop is not None or args.int8_min_speedup is not None):
        raise ConfigError("--int8-max-drop and --int8-min-speedup only apply with --int8")
    from ..inference import load_detector

    detector = load_detector(args.checkpoint)
    if detector is not None:
        return _export_detector(args, detector)
    if args.openvino:
        from ..export.openvino import import_openvino

        import_openvino()  # a missing extra is said before the model loads
    model = with_patch_size(load_model(args.checkpoint), args).eval()
    out = {}
    if args.onnx:
        out = export_onnx(model, args.onnx, dynamic_batch=not args.static_batch, dynamic_size=args.dynamic_size,
                          opset=args.opset, tol=args.tol)
    if args.openvino:
        from ..export.openvino import export_openvino

        out["openvino"] = export_openvino(model, args.openvino, tol=args.tol)
    out["checkpoint"] = str(args.checkpoint)
    if args.int8:
        limits = {k: v for k, v in (("max_drop", args.int8_max_drop), ("min_speedup", args.int8_min_speedup))
                  if v is not None}
        out["int8"] = int8_report(model, args.onnx, eval_data=args.eval_data, eval_limit=args.eval_limit, **limits)

    def render(d):
        rows = []
        if "path" in d:
            rows += [("written", d["path"]), ("max |logit diff| vs PyTorch", f"{d['max_abs_diff']:.2e}"),
                     ("checked shapes (B, H, W)", ", ".join("x".join(map(str, s)) for s in d["checked_shapes"])),
                     ("dynamic batch / size", f"{d['dynamic_batch']} / {d['dynamic_size']}")]
        if "openvino" in d:
            v = d["openvino"]
            rows += [("OpenVINO IR written", v["path"]), ("OpenVINO max |logit diff| vs PyTorch",
                                                          f"{v['max_abs_diff']:.2e} (OpenVINO {v['openvino']}, f32)")]
        if "int8" in d:
            q = d["int8"]
            rows += [("int8 model", q["path"]), ("int8 speed-up vs fp32 ONNX (batch 8)", f"{q['speedup_vs_fp32_onnx']:.2f}x")]
            if "accuracy" in q:
                t = q["accuracy"]["top1"]
                rows += [(f"top-1 on {args.eval_data} ({q['accuracy']['count']} images)",
                          f"PyTorch {t['pytorch']:.2f}%  ONNX {t['onnx']:.2f}%  int8 {t['int8']:.2f}%"),
                         ("int8 top-1 change", f"{q['top1_change_points']:+.2f} points")]
        print_table(f"exported {d['checkpoint']}", ["field", "value"], rows, justify=["left", "left"])

    emit(args, out, render)
    if args.int8 and out["int8"]["warning"]:  # one line on stderr, whatever the output format
        print(out["int8"]["warning"], file=sys.stderr)
    return 0



def _export_detector(args, detector) -> int:
    """A task=detect run's detector to ONNX (vitkit.export.onnx.export_detector_onnx: torch.onnx's TorchScript
    exporter, one image per run, checked against PyTorch); the other targets and options refused in one line."""
    from ..errors import ConfigError
    from ..export.onnx import export_detector_onnx

    refused = [flag for flag, given in (("--openvino", args.openvino), ("--int8", args.int8),
                                        ("--dynamic-size", args.dynamic_size), ("--static-batch", args.static_batch),
                                        ("--patch-size", args.patch_size)) if given]
    if refused:
        raise ConfigError(f"{', '.join(refused)}: not for a detector; a detector exports to ONNX only (--onnx "
                          "OUT.onnx), one image at a time at its trained size")
    out = export_detector_onnx(detector, args.onnx, opset=args.opset, tol=args.tol) | {"checkpoint": str(args.checkpoint)}

    def render(d):
        print_table(f"exported {d['checkpoint']} (detector)", ["field", "value"],
                    [("written", d["path"]), ("max |diff| vs PyTorch (scores; boxes / image side)", f"{d['max_abs_diff']:.2e}"),
                     ("checked images (boxes found)", f"{d['checked_images']} ({', '.join(map(str, d['box_counts']))})"),
                     ("graph", f"one image [1, C, H, W] -> boxes, scores, labels (opset {d['opset']}, {d['exporter']})")],
                    justify=["left", "left"])

    emit(args, out, render)
    return 0
