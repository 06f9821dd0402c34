"""`vitkit embed` against the loop users write by hand with timm, over the same image folder: images per second.

Both sides: the same architecture (vitkit's model and timm's of the same name, random weights: speed does not
depend on them), the same batch size, DataLoader workers and device, JPEG decoding + the model's eval transform,
pooled pre-logits features L2-normalised and saved as one .npy. The timm loop keeps everything in memory and
writes once at the end (no resume, no manifest, no broken-file handling); `vitkit embed` writes resumable chunks
and a manifest. The folder is made of random crops of scikit-image photos saved as JPEG (or pass --folder).

Usage: python benchmarks/embed_throughput.py [--model vit_small_patch16_224] [--n 2000] [--batch-size 64]
         [--workers 4] [--device cpu|cuda] [--quick]
Writes benchmarks/results/embed-throughput-MODEL-DEVICE.{md,json}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from vitkit.bench import machine_info

RESULTS = Path(__file__).resolve().parent / "results"


def make_folder(root: Path, n: int, size: int = 320, seed: int = 0) -> Path:
    """`n` JPEGs (size x size) cut at random from scikit-image's photos, in 4 class folders."""
    from PIL import Image
    from skimage import data

    rng = np.random.default_rng(seed)
    photos = [getattr(data, name)() for name in ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field")]
    for i in range(n):
        img = photos[i % len(photos)]
        h, w = img.shape[:2]
        s = int(rng.integers(min(h, w) // 2, min(h, w) + 1))
        y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
        out = root / f"c{i % 4}" / f"{i:06d}.jpg"
        out.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img[y:y + s, x:x + s]).resize((size, size)).save(out, quality=90)
    return root


def timm_loop(name: str, folder: Path, out: Path, batch_size: int, workers: int, device: str) -> tuple[int, float]:
    """The hand-written baseline: timm model + timm transform + an ImageFolder-style dataset + a loop."""
    import timm
    from PIL import Image
    from timm.data import create_transform, resolve_data_config
    from torch.utils.data import DataLoader, Dataset

    model = timm.create_model(name, pretrained=False, num_classes=0).to(device).eval()
    tf = create_transform(**resolve_data_config({}, model=model))
    from vitkit.data.images import is_image_file

    files = sorted(p for p in folder.rglob("*") if p.is_file() and is_image_file(p))
    with torch.no_grad():  # warm-up (lazy initialisation is not throughput)
        model(torch.zeros(2, 3, *model.pretrained_cfg["input_size"][1:], device=device))

    class Files(Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            return tf(Image.open(files[i]).convert("RGB"))

    t0 = time.perf_counter()
    feats = []
    with torch.no_grad():
        for x in DataLoader(Files(), batch_size=batch_size, num_workers=workers):
            f = model.forward_head(model.forward_features(x.to(device)), pre_logits=True)
            feats.append(torch.nn.functional.normalize(f.float(), dim=1).cpu().numpy())
    np.save(out, np.concatenate(feats))
    return len(files), time.perf_counter() - t0


def vitkit_embed(name: str, folder: Path, out: Path, batch_size: int, workers: int, device: str) -> tuple[int, float]:
    import vitkit
    from vitkit.retrieval import embed

    model = vitkit.create_model(name, num_classes=0).to(device).eval()
    with torch.no_grad():  # warm-up (lazy initialisation is not throughput)
        model(torch.zeros(2, *model.preprocess.input_size, device=device))
    t0 = time.perf_counter()
    meta = embed(model, str(folder), out, batch_size=batch_size, workers=workers)
    return meta["count"], time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_small_patch16_224")
    p.add_argument("--n", type=int, default=2000, help="images in the generated folder")
    p.add_argument("--folder", help="use this image folder instead of generating one")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--quick", action="store_true", help="64 images, vit_tiny, 2 workers: proves the script runs")
    args = p.parse_args()
    if args.quick:
        args.n, args.model, args.workers, args.batch_size = 64, "vit_tiny_patch16_224", 2, 32
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = Path(args.folder) if args.folder else make_folder(tmp / "images", args.n)
        for f in folder.rglob("*"):  # both sides read from the page cache
            if f.is_file():
                f.read_bytes()
        runs = {}
        for side, fn in (("timm loop", timm_loop), ("vitkit embed", vitkit_embed)):
            n, seconds = fn(args.model, folder, tmp / side.split()[0], args.batch_size, args.workers, args.device)
            runs[side] = {"images": n, "seconds": round(seconds, 2), "img_per_s": round(n / seconds, 1)}
            print(f"{side:13s} {n} images in {seconds:.2f} s: {n / seconds:.1f} img/s", flush=True)
    info = machine_info(args.device) | {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv), "model": args.model, "batch_size": args.batch_size,
        "workers": args.workers, "device": args.device}
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"embed-throughput-{args.model}-{args.device.split(':')[0]}"
    stem.with_suffix(".json").write_text(json.dumps({"machine": info, "runs": runs}, indent=1))
    ratio = runs["vitkit embed"]["img_per_s"] / runs["timm loop"]["img_per_s"]
    lines = [f"Embedding throughput, {args.model}, batch {args.batch_size}, {args.workers} workers, {args.device} "
             f"(`{info['command']}`)", "", "| loop | images | seconds | img/s |", "|---|---|---|---|"]
    lines += [f"| {side} | {r['images']} | {r['seconds']} | {r['img_per_s']} |" for side, r in runs.items()]
    lines += ["", f"vitkit / timm: {ratio:.2f}x"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
