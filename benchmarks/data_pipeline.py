"""Does the data pipeline keep up? A recipe's training loader (its augmentations, its worker count)
against the model's training step, both in images per second, on this machine; the loader both ways where the
recipe has a batched form (data.transforms.batched_train_transform: in-memory images at the input size), per
image (torchvision transforms v2 on each image) and batched (one call a batch), as `vitkit train` builds it.

Usage: python benchmarks/data_pipeline.py [--recipe fashion-mnist] [--set KEY=VALUE ...] [--batches 20]
       [--workers N] [--out STEM]
Writes benchmarks/results/data-pipeline-RECIPE.{md,json} (`--out` names another stem). A loader/model ratio below
1 means training waits for data (raise the recipe's `workers`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from vitkit.bench import build_vitkit, machine_info
from vitkit.data.datasets import Transformed, load_data
from vitkit.data.transforms import batched_train_transform, train_transform
from vitkit.training.recipes import get_recipe

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="fashion-mnist")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override, as `vitkit train --set` (e.g. reprob=0.25)")
    p.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: the recipe's)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    r = get_recipe(args.recipe).override(args.sets)
    workers = r.workers if args.workers is None else args.workers
    model = build_vitkit(f"recipe:{args.recipe}").train()
    data = load_data(r.data, seed=r.seed, channels=model.cfg.in_chans)
    per_image = train_transform(model.preprocess, r, data.image_size)
    batched = batched_train_transform(model.preprocess, r, data.image_size)

    def loader_rate(batched_form) -> float:
        ds = Transformed(data.train, per_image, seed=r.seed, batched=batched_form)
        loader = DataLoader(ds, batch_size=r.batch_size, shuffle=True, num_workers=workers, drop_last=True)
        it = iter(loader)
        next(it)  # worker start-up is paid once per epoch, not per batch
        t0 = time.perf_counter()
        for _ in range(args.batches):
            next(it)
        return args.batches * r.batch_size / (time.perf_counter() - t0)

    forms = {"per image": loader_rate(None)}
    if batched is not None:
        forms["batched"] = loader_rate(batched)
    x, y = next(iter(DataLoader(Transformed(data.train, per_image, seed=r.seed), batch_size=r.batch_size)))

    opt = torch.optim.AdamW(model.parameters(), lr=r.lr, fused=True)
    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=r.bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    steps = max(3, args.batches // 4)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    model_rate = steps * r.batch_size / (time.perf_counter() - t0)

    command = " ".join(["python", "benchmarks/data_pipeline.py", *sys.argv[1:]])
    res = {"command": command, "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "machine": machine_info(), "recipe": args.recipe, "overrides": args.sets, "batch_size": r.batch_size,
           "workers": workers, "bf16": r.bf16, "loader_img_per_s": forms, "train_step_img_per_s": model_rate,
           "loader_over_model": {k: v / model_rate for k, v in forms.items()}}
    m = res["machine"]
    label = " ".join([args.recipe, *args.sets])
    lines = [f"Command: `{command}`  ", f"Date: {res['date']}  ",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['threads']} threads)", "",
             "| recipe | batch | workers | loader form | loader img/s | train step img/s | loader / model |",
             "|---|---:|---:|---|---:|---:|---:|",
             *(f"| {label} | {r.batch_size} | {workers} | {form} | {rate:,.0f} | {model_rate:,.0f} | "
               f"{rate / model_rate:.2f} |" for form, rate in forms.items()), ""]
    RESULTS.mkdir(exist_ok=True)
    stem = args.out or f"data-pipeline-{args.recipe}"
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))
    (RESULTS / f"{stem}.json").write_text(json.dumps(res, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
