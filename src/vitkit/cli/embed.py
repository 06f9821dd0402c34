"""`vitkit embed CKPT SRC --out EMB_DIR`: frozen features of an image folder, CSV manifest or built-in dataset."""
from __future__ import annotations

import os
import sys
import time

from .common import add_data_options, add_json, data_options, emit, positive_int, print_table
from .export import add_max_tokens


def register(sub) -> None:
    p = sub.add_parser("embed", help="features of a whole image collection (resumable; torchrun shards it)")
    p.add_argument("checkpoint", nargs="?", help="any checkpoint vitkit can load")
    p.add_argument("source", nargs="?", help="an image folder, a CSV manifest (path[,label]) or digits | fashion-mnist")
    p.add_argument("--out", required=True, help="output folder: embeddings.npy, manifest.jsonl, meta.json")
    p.add_argument("--split", default="all", choices=["all", "train", "val", "test"], help="built-in datasets only")
    p.add_argument("--feature", default="pooled", choices=["pooled", "cls", "patch"],
                   help="pooled: what the classifier sees (CLIP: encode_image); cls: the class token; patch: all tokens")
    p.add_argument("--no-normalize", action="store_true", help="keep raw features (default: L2-normalised)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--workers", type=int, default=min(4, (os.cpu_count() or 1) // 2),
                   help="data-loading processes (0: decode in the main process; default: half the cores, at most 4)")
    p.add_argument("--chunk-size", type=positive_int, default=1024,
                   help="images per resumable part (a kill loses at most one chunk of work)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--overwrite", action="store_true", help="redo finished or different embeddings in --out")
    p.add_argument("--merge", action="store_true", help="only join the parts of a finished sharded run in --out")
    p.add_argument("--keep-parts", action="store_true", help="keep parts/ after merging")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_max_tokens(p)
    add_data_options(p)
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..errors import ConfigError
    from ..retrieval.embed import embed, merge

    rank = int(os.environ.get("RANK", 0))
    t0 = time.perf_counter()
    if args.merge:
        meta = merge(args.out, keep_parts=args.keep_parts)
    else:
        if not args.checkpoint or not args.source:
            raise ConfigError("give a checkpoint and a source: vitkit embed CKPT SRC --out EMB_DIR")
        from ..api import load_model

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device.startswith("cuda") and int(os.environ.get("WORLD_SIZE", 1)) > 1 and ":" not in device:
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        model = load_model(args.checkpoint, device=device, max_tokens=args.max_tokens)
        meta = embed(model, args.source, args.out, checkpoint=args.checkpoint, split=args.split,
                     feature=args.feature, normalize=not args.no_normalize, dtype=args.dtype,
                     batch_size=args.batch_size, workers=args.workers, chunk_size=args.chunk_size,
                     progress=not (args.quiet or args.json) and sys.stderr.isatty(), overwrite=args.overwrite,
                     options=data_options(args))
        if rank != 0:
            return 0
    seconds = time.perf_counter() - t0
    summary = {k: v for k, v in meta.items() if k != "skipped"} | {
        "out": str(args.out), "seconds": round(seconds, 2), "skipped": meta.get("skipped", [])}

    def render(d):
        print_table(f"embeddings ({d['out']})", ["images", "rows", "shape", "dtype", "skipped", "seconds"],
                    [(d["items"], d["count"], "x".join(map(str, d["shape"])), d["dtype"], d["num_skipped"],
                      d["seconds"])])

    emit(args, summary, render)
    for s in meta.get("skipped", [])[:20]:
        print(f"vitkit embed: skipped: {s['reason']}", file=sys.stderr)
    if meta.get("num_skipped", 0) > 20:
        print(f"vitkit embed: ... and {meta['num_skipped'] - 20} more (all in {args.out}/meta.json)", file=sys.stderr)
    return 0
