"""`vitkit train`: train or fine-tune on a built-in set, an image folder or a CSV manifest; resumable.

Also runs under `torchrun --nproc_per_node N -m vitkit train ...` (DDP: gloo on CPU, nccl on GPU), or with
`--strategy fsdp` sharded (training/fsdp.py).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from .common import add_json, emit, positive_int


def register(sub) -> None:
    p = sub.add_parser("train", help="train a ViT (or a ResNet baseline) and write a run folder with a report")
    p.add_argument("--recipe", default=None, help="preset: digits (default), fashion-mnist, fashion-mnist-resnet18, "
                   "finetune; `--list-recipes` shows them")
    p.add_argument("--data", help="digits | fashion-mnist | FOLDER (class sub-folders) | MANIFEST.csv (path,label)")
    p.add_argument("--model", help="registered ViT name (`vitkit models`) or resnet18/34/50")
    p.add_argument("--out", help="run folder (default runs/<recipe>-<time> for a preset as it is, "
                   "runs/<data>-<model>-<time> when --data, --model or --finetune changes it)")
    p.add_argument("--overwrite", action="store_true", help="replace the finished run in --out (refused without it)")
    p.add_argument("--epochs", type=positive_int, help="a fixed number of epochs (also turns a recipe's time budget off)")
    p.add_argument("--time-budget", metavar="DURATION", help="plan the epochs to end within this wall time "
                   "(900, 900s, 15m, 1.5h), evaluations included; measured on this machine as the run starts")
    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--lr", type=float, help="learning rate (a preset's own lr is refused above 1e-3 for a model "
                   "over 20M parameters: choose one with --lr)")
    p.add_argument("--seed", type=int)
    p.add_argument("--img-size", type=int, help="train at this resolution (position embeddings are resampled)")
    p.add_argument("--patch-size", type=positive_int, metavar="P", help="train at P-pixel patches; with --finetune "
                   "the checkpoint's patch kernel is resampled to P (FlexiViT's pseudo-inverse resize) and its "
                   "position grid follows (the same as --set model.patch_size=P)")
    p.add_argument("--max-tokens", type=positive_int, metavar="N", help="NaFlex: every image at its own aspect ratio "
                   "within N patches, batches padded and masked and sized by token budget (the same as --set "
                   "max_tokens=N; --set token_lens=64,144,256 draws a sequence length per step)")
    p.add_argument("--task", help="training objective: classification, distillation, mae, dino, segment or detect "
                   "(the same as --set task=NAME)")
    p.add_argument("--teacher", metavar="CKPT|recipe:NAME", help="distillation teacher: a checkpoint, or a preset "
                   "trained first (the same as --set task.teacher=...)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any recipe field (repeatable), e.g. --set ema=true --set model.depth=6")
    p.add_argument("--finetune", metavar="CKPT", help="start from any checkpoint vitkit can load (new head, "
                   "resolution and channels as the data needs); defaults to the finetune recipe")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its saved state")
    p.add_argument("--strict", action="store_true", help="stop at the first unreadable image instead of skipping it")
    p.add_argument("--stop-after-epochs", type=positive_int, metavar="N",
                   help="stop cleanly after epoch N (state, checkpoints and logs saved; no summary yet); "
                   "finish later with --out RUN --resume, which reaches the same weights as an uninterrupted run")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="auto (default): the recipe's bf16 only where the hardware has native bf16 (else fp32, "
                   "with a note); bf16 or fp32 force it (`vitkit doctor` shows what this machine has)")
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp",
                   help="with more than one process (torchrun): ddp (default) replicates the model; fsdp shards "
                   "weights, gradients and AdamW state (`vitkit cost MODEL --train-memory` compares them)")
    p.add_argument("--list-recipes", nargs="?", const="", default=None, metavar="NAME",
                   help="print the presets: a table with each one's command and the gist of its target; with NAME "
                   "(or -v) the full target and measurements; --json gives them all")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines (the final line "
                   "with the report path still prints)")
    add_json(p)
    p.set_defaults(func=run)


def resolve_recipe(args):
    """The recipe to run and the checkpoint to start from. A preset run on other data or another model
    becomes `custom`, based on the preset (recipes.derive)."""
    from ..errors import ConfigError
    from ..training.recipes import Recipe, derive, get_recipe

    if args.resume:
        if not args.out:
            raise ConfigError("--resume needs --out RUN_FOLDER")
        cfg = Path(args.out) / "config.json"
        if not cfg.exists():
            raise ConfigError(f"{args.out}: nothing to resume (no config.json)")
        saved = json.loads(cfg.read_text())
        recipe = Recipe.from_dict(saved["recipe"])
        if args.set or args.epochs or args.lr or args.batch_size or args.data or args.model or args.recipe or args.task \
                or args.teacher or args.time_budget or args.patch_size or args.max_tokens:
            raise ConfigError("--resume continues the saved recipe exactly; start a new run to change it")
        return recipe, saved.get("finetune")
    name = args.recipe or ("finetune" if args.finetune else "digits")
    recipe = get_recipe(name)
    changes = {}
    for flag, field in (("data", "data"), ("model", "model"), ("epochs", "epochs"), ("batch_size", "batch_size"),
                        ("lr", "lr"), ("seed", "seed"), ("img_size", "img_size"), ("task", "task"),
                        ("max_tokens", "max_tokens")):
        if getattr(args, flag) is not None:
            changes[field] = getattr(args, flag)
    if args.time_budget is not None:
        from ..training.budget import parse_duration

        changes["time_budget_s"] = parse_duration(args.time_budget)
    if "model" in changes and changes["model"] != recipe.model:
        changes.setdefault("model_args", {})  # a preset's architecture tweaks belong to its own model,
        changes.setdefault("threads", None)  # and so does its thread count (digits: 1 for a 0.3M model)
    recipe = recipe.replace(**changes).override(args.set + ([f"task.teacher={args.teacher}"] if args.teacher else []))
    if args.patch_size is not None:
        recipe = recipe.replace(model_args={**recipe.model_args, "patch_size": args.patch_size})
    if not args.finetune and not recipe.model:
        raise ConfigError(f"recipe {recipe.name!r} needs --finetune CKPT or --model NAME")
    return derive(recipe, args.finetune), args.finetune


def lr_given(args) -> bool:
    """The user chose the lr (--lr or --set lr=...), rather than taking the preset's."""
    return args.lr is not None or any(s.partition("=")[0].strip().replace("-", "_") == "lr" for s in args.set)


def _short(text: str) -> str:
    """A file-name-safe short name: a built-in set, a folder's or manifest's name, a model or checkpoint name."""
    import re

    name = Path(str(text).rstrip("/\\")).name or str(text)
    for suffix in (".safetensors", ".pth", ".pt", ".bin", ".npz", ".ckpt", ".csv", ".tsv", ".txt"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("._") or "run"


def default_out(recipe, finetune: str | None) -> str:
    """runs/<recipe>-<time> for a preset as it is; runs/<data>-<model>-<time> when it was changed."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if recipe.name != "custom" and not finetune:
        return f"runs/{recipe.name}-{stamp}"
    return f"runs/{_short(recipe.data)}-{_short(finetune or recipe.model)}-{stamp}"


def canonical_command(recipe, out: str, finetune: str | None) -> str:
    """The command that reproduces this run: the preset plus every field that differs from it."""
    import shlex

    from ..training.recipes import PRESETS

    base = PRESETS.get(recipe.based_on or recipe.name)
    parts = ["vitkit", "train", "--recipe", base.name] if base else ["vitkit", "train"]
    if finetune:
        parts += ["--finetune", str(finetune)]
    ref = base.to_dict() if base else {}
    for key, value in recipe.to_dict().items():
        if key in ("name", "command", "expected", "based_on") or ref.get(key, object()) == value:
            continue
        text = json.dumps(value) if isinstance(value, (dict, list)) else "none" if value is None else str(value)
        parts += ["--set", f"{key}={text}"]
    return " ".join(shlex.quote(p) for p in [*parts, "--out", out])


def _gist(text: str) -> str:
    """The head of a preset's `expected` text: asides in parentheses dropped, up to the first ';' or '. '."""
    import re

    while re.search(r"\([^()]*\)", text):  # innermost first: asides nest
        text = re.sub(r"\s*\([^()]*\)", "", text)
    return re.split(r";\s|\.\s", text, maxsplit=1)[0].strip()


def _fit(text: str, width: int) -> str:
    """`text` cut at a word boundary to `width` characters, an ellipsis marking the cut."""
    if len(text) <= width:
        return text
    return text[: width - 1].rsplit(" ", 1)[0].rstrip(" ,:") + "…"


def list_recipes(args) -> int:
    """`--list-recipes`: two lines per preset (name and the gist of its target; task and command); `NAME` or
    -v: the full text, which runs to several sentences of measurements; --json: every field."""
    import textwrap

    from ..training.recipes import PRESETS, get_recipe
    from .common import console

    wanted = [get_recipe(args.list_recipes)] if args.list_recipes else list(PRESETS.values())
    rows = [{"name": r.name, "task": r.task, "command": r.command, "model": r.model, "data": r.data,
             "epochs": r.epochs, "expected": r.expected} for r in wanted]
    width = console().width
    if getattr(args, "json", False):
        emit(args, rows[0] if args.list_recipes else rows, lambda d: None)
    elif args.list_recipes or getattr(args, "verbose", False):
        for row in rows:
            print(f"{row['name']} ({row['task']})\n  command:  {row['command']}\n"
                  f"  model:    {row['model'] or 'from --finetune'} on {row['data']}, {row['epochs']} epochs")
            print(textwrap.fill(row["expected"], width=max(width, 40), initial_indent="  expected: ",
                                subsequent_indent=" " * 12, break_long_words=False, break_on_hyphens=False) + "\n")
    else:  # two lines a preset, each within the terminal: the target's gist, then the task and the command
        name_w, task_w = max(len(r["name"]) for r in rows), max(len(r["task"]) for r in rows)
        gist_w = max(width - name_w - 2, 30)
        print(f"{'recipe':<{name_w}}  target (`vitkit train --list-recipes NAME` says it in full)\n"
              f"  {'task':<{task_w}}  command")
        for row in rows:
            print(f"{row['name']:<{name_w}}  {_fit(_gist(row['expected']), gist_w)}\n"
                  f"  {row['task']:<{task_w}}  {row['command']}")
    return 0


def run(args) -> int:
    from ..training.console import Reporter
    from ..training.pipeline import train

    if args.list_recipes is not None:
        return list_recipes(args)
    recipe, finetune = resolve_recipe(args)
    out = args.out or default_out(recipe, finetune)
    summary = train(recipe, out, resume=args.resume, finetune=finetune, strict=args.strict,
                    reporter=Reporter(quiet=args.quiet or args.json), stop_after_epochs=args.stop_after_epochs,
                    command=canonical_command(recipe, out, finetune), overwrite=args.overwrite,
                    lr_from_preset=not args.resume and not lr_given(args), precision=args.precision,
                    strategy=args.strategy)
    if summary and args.json:
        emit(args, summary, lambda d: None)
    return 0
