"""`vitkit tradeoff CKPT [--data D]`: top-1, GMACs, tokens, batch-1 latency and throughput of one checkpoint at
each setting of its run-time knobs (resolution, patch size, token merging), as a table, a Pareto plot and JSON;
`--budget-gmacs G` or `--budget-ms T` picks the most accurate setting within the budget and `--save OUT` writes
it as the checkpoint's default inference settings (vitkit.tradeoff)."""
from __future__ import annotations

import datetime
import shlex
import sys

from .common import add_data_options, add_json, data_options, emit, non_negative_float, positive_int, print_table


def register(sub) -> None:
    p = sub.add_parser("tradeoff", help="accuracy vs cost of a checkpoint over resolution, patch size and token "
                       "merging, measured here; pick a setting for a budget")
    p.add_argument("checkpoint", help="a vitkit checkpoint or run folder (any file `vitkit eval` takes, not .onnx)")
    p.add_argument("--data", default=None, help="the images to score (default: the data the checkpoint was trained "
                   "on, its held-out split, as `vitkit eval` picks it)")
    p.add_argument("--split", default=None, help="which split (default: test, else val)")
    p.add_argument("--grid", default=None, metavar="AXES",
                   help="settings to measure, the product of the axes given: 'img=40,56;patch=4,8;merge=0,8;"
                   "tokens=0,100' (default: one knob at a time from the native point: resolution x1/2, 3/4, 5/4; "
                   "patches 1.5x and 2x; merging a quarter, half and three quarters of the tokens; a token budget "
                   "(NaFlex, each image at its own aspect ratio) of the native patch count and half of it)")
    p.add_argument("--limit", type=positive_int, default=None, help="score the first N images of the split")
    p.add_argument("--batch", type=positive_int, default=8, help="batch size of the throughput timing (default 8)")
    p.add_argument("--batch-size", type=positive_int, default=256, help="batch size of the scoring")
    p.add_argument("--repeats", type=positive_int, default=7, help="timed rounds per setting (default 7)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--budget-gmacs", type=non_negative_float, default=None, metavar="G",
                        help="pick the most accurate setting with at most G GMACs per image")
    budget.add_argument("--budget-ms", type=non_negative_float, default=None, metavar="T",
                        help="pick the most accurate setting with batch-1 latency at most T ms on this machine")
    p.add_argument("--save", default=None, metavar="OUT.safetensors",
                   help="with a budget: a copy of the checkpoint that predict, eval, serve and load_model run at "
                   "the chosen setting by default (the weights unchanged; provenance says what chose it)")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="write the Pareto plot here")
    p.add_argument("--out", default=None, metavar="FILE.json", help="write the report as JSON here")
    add_data_options(p, "; default: the settings the training run recorded, when --data is its data")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from .. import tradeoff as t
    from .._files import atomic_write_text
    from ..api import load_model
    from ..bench import machine_info
    from ..data.datasets import load_eval_split, same_data
    from ..errors import ConfigError
    from ..inference import training_data
    from ..training.models import in_chans

    if args.save and args.budget_gmacs is None and args.budget_ms is None:
        raise ConfigError("--save writes the setting a budget picks: add --budget-gmacs G or --budget-ms T")
    if str(args.checkpoint).endswith(".onnx"):
        raise ConfigError(f"{args.checkpoint}: an exported model runs at one setting; give the checkpoint it came from")
    with t.quiet_loads():
        model = load_model(args.checkpoint)
    settings, refused = (t.grid_from_axes(model, t.parse_grid(args.grid)) if args.grid
                         else (t.default_grid(model), []))
    for line in refused:
        print(f"vitkit tradeoff: skipped {line}", file=sys.stderr)
    trained = training_data(str(args.checkpoint), model.provenance or {})
    data = args.data or trained["data"]
    if not data:
        raise ConfigError(f"{args.checkpoint} does not record the data it was trained on: give --data")
    same = args.data is None or same_data(args.data, trained["data"])
    seed = trained["seed"] if same and trained["seed"] is not None else 0
    options = data_options(args) or (trained["options"] if same else None)
    bundle, split, ds = load_eval_split(data, channels=in_chans(model), class_names=model.class_names, split=args.split,
                                        seed=seed, val_fraction=(trained["val_fraction"] if same else None) or 0.0,
                                        options=options)
    if model.num_classes != len(bundle.class_names):
        raise ConfigError(f"the model has {model.num_classes} outputs but {data} has {len(bundle.class_names)} classes")
    rows = t.measure(args.checkpoint, settings, ds, model.num_classes, batch=args.batch, batch_size=args.batch_size,
                     limit=args.limit, repeats=args.repeats)
    command = "vitkit " + " ".join(map(shlex.quote, sys.argv[1:])) if sys.argv[1:] else None
    report = {"checkpoint": str(args.checkpoint), "data": bundle.name, "split": split, "count": rows[0]["count"],
              "native": vars(t.native(model)), "batch": args.batch, "repeats": args.repeats, "rows": rows,
              "pareto_gmacs": [r["label"] for r in t.pareto(rows, "gmacs")],
              "pareto_latency": [r["label"] for r in t.pareto(rows, "latency_ms")],
              "machine": machine_info(), "command": command,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if args.budget_gmacs is not None or args.budget_ms is not None:
        report["chosen"] = t.choose(rows, budget_gmacs=args.budget_gmacs, budget_ms=args.budget_ms)
        report["budget"] = {"gmacs": args.budget_gmacs} if args.budget_gmacs is not None else {"ms": args.budget_ms}
        if args.save:
            how = {"chosen_by": command or "vitkit tradeoff", "budget": report["budget"],
                   "data": bundle.name, "split": split, "machine": report["machine"]["cpu"], "date": report["date"]}
            report["saved"] = str(t.save_choice(args.checkpoint, report["chosen"], args.save, how))
    if args.plot:
        report["plot"] = str(t.write_plot(report, args.plot))
    if args.out:
        atomic_write_text(args.out, json.dumps(report, indent=1, default=str))

    def render(r):
        front = set(r["pareto_gmacs"]) | set(r["pareto_latency"])
        print_table(f"{r['checkpoint']} on {r['data']} ({r['split']}, {r['count']} images); timed at batch 1 and "
                    f"{r['batch']} on {r['machine']['cpu']} ({r['machine']['threads']} threads)",
                    ["setting", "top-1 %", "GMACs", "tokens in/out", "ms (b=1)", f"img/s (b={r['batch']})", "Pareto"],
                    [(x["label"], f"{x['top1']:.2f}", f"{x['gmacs']:.3f}",
                      "-" if x["tokens"] is None else f"{x['tokens']}/{x['tokens_out']}", f"{x['latency_ms']:.2f}",
                      f"{x['img_per_s']:.1f}", "*" if x["label"] in front else "") for x in r["rows"]])
        if r.get("chosen"):
            c, (unit, limit) = r["chosen"], next(iter(r["budget"].items()))
            print(f"within {limit:g} {'GMACs' if unit == 'gmacs' else 'ms'}: {c['label']} (top-1 {c['top1']:.2f}%, "
                  f"{c['gmacs']:.3f} GMACs, {c['latency_ms']:.2f} ms)")
        if r.get("saved"):
            print(f"saved {r['saved']}: predict, eval and serve run it at {r['chosen']['label']} by default")
        if r.get("plot"):
            print(f"plot: {r['plot']}")

    emit(args, report, render)
    return 0
