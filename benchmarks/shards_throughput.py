"""Images per second into the model: the same JPEG photos read from a class folder and from WebDataset tar
shards (`vitkit shards`), through the training loader (the `finetune` recipe's random-resized crop and flip
at 224 px, shuffled, DataLoader workers) and the eval loader (resize + centre crop, in order).

Usage: python benchmarks/shards_throughput.py [--images 2000] [--workers 0 2] [--batches 20] [--repeats 3]
       [--out FILE.json]
The photos (scikit-image's, random crops of them, saved as 256x256 JPEGs) and their shards are written to a
temporary folder (or --root) once; each measurement skips the first batch (worker start-up) and reads the
files from the page cache, so it is decoding and I/O calls that are compared, not the disk.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from vitkit.bench import machine_info
from vitkit.data.datasets import Transformed, load_data
from vitkit.data.shards import write_shards
from vitkit.data.transforms import eval_transform, train_transform
from vitkit.training.recipes import get_recipe

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "cat", "immunohistochemistry", "hubble_deep_field", "retina")


def make_folder(root: Path, n: int, seed: int = 0) -> Path:
    """`n` 256x256 JPEGs in one class folder per photo: random crops (scale 0.3-1) of scikit-image's photos."""
    from skimage import data

    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(getattr(data, name)()).convert("RGB") for name in PHOTOS]
    for i in range(n):
        c = i % len(photos)
        img = photos[c]
        side = int(min(img.size) * rng.uniform(0.3, 1.0))
        x, y = rng.integers(0, img.width - side + 1), rng.integers(0, img.height - side + 1)
        folder = root / PHOTOS[c]
        folder.mkdir(parents=True, exist_ok=True)
        img.crop((x, y, x + side, y + side)).resize((256, 256)).save(folder / f"{i:06d}.jpg", quality=90)
    return root


def rate(loader: DataLoader, batches: int) -> float:
    """Images per second over `batches` batches after the first."""
    it = iter(loader)
    next(it)
    t0, n = time.perf_counter(), 0
    for _ in range(batches):
        try:
            x, _ = next(it)
        except StopIteration:
            break
        n += len(x)
    return n / (time.perf_counter() - t0)


def loader(ds, kind: str, workers: int, pre, recipe, args) -> DataLoader:
    """The training loader (the recipe's augmentations, shuffled) or the eval loader (in order) over `ds`."""
    if kind == "train":
        return DataLoader(Transformed(ds, train_transform(pre, recipe), seed=0), batch_size=args.batch_size,
                          shuffle=True, num_workers=workers, generator=torch.Generator().manual_seed(0))
    return DataLoader(Transformed(ds, eval_transform(pre), deterministic=False), batch_size=args.batch_size,
                      num_workers=workers)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--per-shard", type=int, default=500)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=20, help="timed batches per measurement (after one warm-up)")
    p.add_argument("--repeats", type=int, default=3, help="measurements per setting (the median is reported)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the main process")
    p.add_argument("--root", help="where the photos and shards go (default: a temporary folder)")
    p.add_argument("--out", help="also write the results here as JSON")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.root or tmp)
        folder = root / "folder"
        if not folder.exists():
            make_folder(folder, args.images)
        shards = root / "shards"
        if not (shards / "classes.json").exists():
            write_shards(str(folder), shards, args.per_shard)
        recipe = get_recipe("finetune")
        from vitkit.api import create_model

        pre = create_model("vit_small_patch16_224", num_classes=0).preprocess
        sets = {name: load_data(str(spec)).train for name, spec in (("folder", folder), ("shards", shards))}
        rows = []
        for loader_kind in ("train", "eval"):
            for workers in args.workers:
                rates: dict[str, list[float]] = {name: [] for name in sets}
                for r in range(args.repeats):  # folder and shards alternate: a busy machine's drift hits both
                    for name in (list(sets) if r % 2 == 0 else list(sets)[::-1]):
                        rates[name].append(rate(loader(sets[name], loader_kind, workers, pre, recipe, args),
                                                args.batches))
                for name, got in rates.items():
                    rows.append({"source": name, "loader": loader_kind, "workers": workers,
                                 "img_per_s": round(float(np.median(got)), 1), "runs": [round(v, 1) for v in got]})
                    print(f"{name:7s} {loader_kind:5s} workers={workers}: {rows[-1]['img_per_s']:8.1f} img/s "
                          f"(median of {len(got)})", flush=True)
        sizes = {"folder_bytes": sum(f.stat().st_size for f in folder.rglob("*.jpg")),
                 "shard_bytes": sum(f.stat().st_size for f in shards.glob("*.tar"))}
    result = {"images": args.images, "per_shard": args.per_shard, "batch_size": args.batch_size,
              "batches": args.batches, "input": "256x256 JPEG q90 -> 224 px", "results": rows, **sizes,
              "machine": machine_info()}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
