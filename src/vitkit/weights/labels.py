"""Class names that published weights imply: the 1000 ImageNet-1k classes, shipped as a package asset
(assets/imagenet1k_classes.tsv, written from timm's synset files by tools/make_imagenet_classes.py)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

ASSET = Path(__file__).resolve().parents[1] / "assets" / "imagenet1k_classes.tsv"


@lru_cache(maxsize=1)
def _imagenet1k() -> tuple[str, ...]:
    return tuple(line.split("\t", 1)[1] for line in ASSET.read_text(encoding="utf-8").splitlines() if line)


def imagenet1k_class_names() -> list[str]:
    """The 1000 ImageNet-1k class names in label order ('tench', 'goldfish', ...)."""
    return list(_imagenet1k())


def is_imagenet1k_tag(tag: str) -> bool:
    """A pretrained tag whose head was trained (or fine-tuned) on ImageNet-1k: `fb_in1k`,
    `augreg_in21k_ft_in1k`, `..._ft_in1k`; not `orig_in21k`, `mae`, `in22k`."""
    parts = tag.lower().replace(".", "_").split("_")
    return "in1k" in parts
