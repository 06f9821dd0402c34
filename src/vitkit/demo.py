"""`make demo` / `python -m vitkit.demo`: train the default `digits` recipe (a small ViT, about a minute on
2 CPU cores), print where the report is, then classify a few held-out digits written out as PNG files.

best.safetensors is the epoch that scored best on the validation split the recipe carves out of train; the
PNG files come from the test split (seed 0, the demo's), which neither training nor that choice saw."""
from __future__ import annotations

import sys
import time
from pathlib import Path


def main(out: str | None = None) -> int:
    import numpy as np
    from PIL import Image

    from .cli.main import main as cli

    out = out or f"runs/demo-digits-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"vitkit demo: training the `digits` recipe into {out}", flush=True)
    rc = cli(["train", "--recipe", "digits", "--out", out])
    if rc:
        return rc
    # a few held-out test digits as PNG files, the way a user would hand images to `vitkit predict`
    from .data.datasets import load_data

    test = load_data("digits", seed=0).test
    folder = Path(out) / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in (0, 1, 2, 3, 4, 5):
        img, label = test[i * 37]
        path = folder / f"test{i * 37:03d}_label{label}.png"
        Image.fromarray(img[0].numpy().astype(np.uint8), mode="L").save(path)
        paths.append(str(path))
    print(f"\nvitkit predict {out}/best.safetensors {folder}/*.png --top-k 2", flush=True)
    return cli(["predict", f"{out}/best.safetensors", *paths, "--top-k", "2"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
