"""`vitkit shards SRC --out DIR --per-shard N`: a folder of class folders, a CSV manifest or a Hugging Face
dataset (streamed with --set data.streaming=true) as WebDataset tar shards (`--data DIR` reads them back),
converted once."""
from __future__ import annotations

import sys

from .common import add_data_options, add_json, data_options, emit, positive_int, print_table


def register(sub) -> None:
    p = sub.add_parser("shards", help="write a folder, CSV manifest or Hugging Face dataset as WebDataset tar shards "
                                      "(--data reads them)")
    p.add_argument("source", help="a folder of class folders (or train/ val/ test/ of them), a CSV manifest, or a "
                                  "Hugging Face dataset (hf:NAME, a save_to_disk folder, Parquet / Arrow files)")
    p.add_argument("--out", required=True, help="output folder: {split}-000000.tar ... and classes.json")
    p.add_argument("--per-shard", type=positive_int, default=10_000, help="samples per shard (default 10000)")
    p.add_argument("--strict", action="store_true", help="stop at the first unreadable image (default: skip it)")
    p.add_argument("--overwrite", action="store_true", help="replace the shards already in --out")
    add_data_options(p, "; data.streaming=true reads a dataset row by row, never downloaded whole")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..data.shards import write_shards

    res = write_shards(args.source, args.out, args.per_shard, strict=args.strict, overwrite=args.overwrite,
                       options=data_options(args))

    def render(d):
        print_table(f"shards ({d['out']})", ["split", "samples", "shards"],
                    [(s, d["samples"][s], d["shards"][s]) for s in d["samples"]])

    emit(args, res, render)
    for s in res["skipped"][:20]:
        print(f"vitkit shards: skipped: {s['reason']}", file=sys.stderr)
    if res["num_skipped"] > 20:
        print(f"vitkit shards: ... and {res['num_skipped'] - 20} more", file=sys.stderr)
    return 0
