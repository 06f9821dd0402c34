"""Fashion-MNIST (Xiao et al. 2017): the idx gzip files, found locally or downloaded with checksums.

Where we look, in order: $VITKIT_FASHION_MNIST, Debian's `dataset-fashion-mnist` package
(/usr/share/datasets/fashion-mnist), the vitkit cache ($VITKIT_CACHE or ~/.cache/vitkit/fashion-mnist);
otherwise we download into the cache from the official source and verify each file's MD5 (published
by the dataset authors) before it is used.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import struct
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError, OfflineError

CLASS_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot"]
URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
# MD5 sums from the dataset's README (github.com/zalandoresearch/fashion-mnist)
FILES = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")


def cache_dir() -> Path:
    root = os.environ.get("VITKIT_CACHE") or Path.home() / ".cache" / "vitkit"
    return Path(root) / "fashion-mnist"


def candidate_dirs() -> list[Path]:
    dirs = [Path(os.environ["VITKIT_FASHION_MNIST"])] if os.environ.get("VITKIT_FASHION_MNIST") else []
    return dirs + [DEBIAN_DIR, cache_dir()]


def find_local() -> Path | None:
    for d in candidate_dirs():
        if all((d / name).is_file() for name in FILES):
            return d
    return None


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(dest: Path | None = None, timeout: float = 30.0) -> Path:
    """Fetch the four files into `dest` (the cache by default), verifying MD5; atomic per file."""
    from .._files import atomic_path

    dest = dest or cache_dir()
    for name, md5 in FILES.items():
        target = dest / name
        if target.is_file() and _md5(target) == md5:
            continue
        try:
            with atomic_path(target) as tmp:
                with urllib.request.urlopen(URL + name, timeout=timeout) as r, open(tmp, "wb") as f:
                    f.write(r.read())
                if (got := _md5(tmp)) != md5:
                    raise DataError(f"{URL + name}: checksum mismatch (md5 {got}, expected {md5}); not used")
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            raise OfflineError(missing_message(f"download failed: {getattr(e, 'reason', e)}")) from None
    return dest


def missing_message(why: str = "") -> str:
    looked = ", ".join(str(d) for d in candidate_dirs())
    return (f"Fashion-MNIST not found (looked in {looked}){'; ' + why if why else ''}. Install it with "
            "`sudo apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or download the four idx .gz files "
            f"from {URL} into {cache_dir()} (or run with network access and vitkit downloads and verifies them)")


def read_idx(path: Path) -> np.ndarray:
    """An idx file (gzip or plain) -> uint8 array ([N] labels or [N, H, W] images)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: unreadable idx file ({e})") from None
    if len(data) < 8:
        raise DataError(f"{path}: too short to be an idx file")
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise DataError(f"{path}: not an unsigned-byte idx file")
    dims = struct.unpack(f">{ndim}I", data[4: 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise DataError(f"{path}: idx header says {dims} but holds {body.size} values (truncated?)")
    return body.reshape(dims)


def load(allow_download: bool = True) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{'train': (images uint8 [60000, 1, 28, 28], labels int64), 'test': (... [10000] ...)}, plus 'dir'."""
    root = find_local()
    if root is None:
        if not allow_download or os.environ.get("VITKIT_OFFLINE"):
            raise OfflineError(missing_message("offline mode"))
        root = download()
    out = {"dir": root}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(root / f"{prefix}-images-idx3-ubyte.gz")
        labels = read_idx(root / f"{prefix}-labels-idx1-ubyte.gz")
        if len(images) != len(labels):
            raise DataError(f"{root}: {split} has {len(images)} images but {len(labels)} labels")
        out[split] = (torch.from_numpy(images.copy())[:, None], torch.from_numpy(labels.astype(np.int64)))
    return out
