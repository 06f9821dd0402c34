"""Hybrid ViTs: patches from a CNN feature map (ResNetV2 / ResNet-D stems, small-image conv stems) (issue 11).

A hybrid is a `vit`-family model whose `embed_layer` names a CNN stem (layers/hybrid_embed.py); everything after
the embedding is the plain VisionTransformer, so checkpoints, save/load, training, intermediates and the
position-table rules are the ViT's. `patch_size` is in image pixels (the backbone's stride times the patch on
its feature map), so `vit_base_r50_s16_224` has patch_size 16 and a 14x14 grid, as its name says.

Names are timm's (`timm/models/vision_transformer_hybrid.py`), with its parameter counts and key names, so a
timm checkpoint loads unchanged and an original JAX `.npz` through weights/importers/jax_npz.py.
"""
from __future__ import annotations

from ..layers import register_layer
from ..layers.hybrid_embed import (
    MobileClipStemEmbed,
    ResNet26DEmbed,
    ResNet50DEmbed,
    ResNet50DS16Embed,
    ResNetV2R26Embed,
    ResNetV2R50Embed,
    ResNetV2R50S16Embed,
    ResNetV2StemEmbed,
    SmallConvStem3Embed,
    SmallConvStemEmbed,
)
from .config import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, ViTConfig
from .registry import Pretrained, register_model
from .vit_variants import size_config  # also registers the `vit` family the hybrids belong to

# embed_layer name -> stem; one name per stem so a config needs no extra field
HYBRID_EMBEDS = {
    "resnetv2_stem": ResNetV2StemEmbed,  # stride 4, 64 channels
    "resnetv2_r26": ResNetV2R26Embed,  # stride 32, 2048
    "resnetv2_r50_s16": ResNetV2R50S16Embed,  # stride 16, 1024
    "resnetv2_r50": ResNetV2R50Embed,  # stride 32, 2048
    "resnet26d": ResNet26DEmbed,  # stride 32, 2048
    "resnet50d": ResNet50DEmbed,  # stride 32, 2048
    "resnet50d_s16": ResNet50DS16Embed,  # stride 16, 1024
    "mobileclip_stem": MobileClipStemEmbed,  # stride 16, D (no separate projection)
    "conv_small": SmallConvStemEmbed,  # stride 2, D/2
    "conv_small3": SmallConvStem3Embed,  # the same with a third conv
}
for _name, _cls in HYBRID_EMBEDS.items():
    register_layer("embed", _name)(_cls)


def _add(name: str, embed: str, patch: int, size: str | dict, *, img_size: int = 224, tags: tuple[str, ...] = (),
         hub: str = "timm", group: str = "hybrid", **kw) -> None:
    entry = {k: kw.pop(k) for k in ("mean", "std", "crop_pct", "interpolation", "notes") if k in kw}
    entry.setdefault("crop_pct", 0.9 if img_size == 224 else 1.0)
    dims = size_config(size) if isinstance(size, str) else size
    pretrained = {tag: Pretrained(hub=f"{hub}/{name}.{tag}") for tag in tags}
    register_model(name, "vit", ViTConfig(img_size=img_size, patch_size=patch, embed_layer=embed, **dims, **kw),
                   group=group, pretrained=pretrained, **entry)


def _register() -> None:
    jax = dict(mean=INCEPTION_MEAN, std=INCEPTION_STD)  # the AugReg / original JAX weights see [-1, 1] inputs
    # ResNetV2 (BiT) stems with weight-standardised convs, GroupNorm and TF 'SAME' padding
    _add("vit_tiny_r_s16_p8_224", "resnetv2_stem", 32, "tiny", tags=("augreg_in21k_ft_in1k", "augreg_in21k"), **jax)
    _add("vit_tiny_r_s16_p8_384", "resnetv2_stem", 32, "tiny", img_size=384, tags=("augreg_in21k_ft_in1k",), **jax)
    _add("vit_small_r26_s32_224", "resnetv2_r26", 32, "small", tags=("augreg_in21k_ft_in1k", "augreg_in21k"), **jax)
    _add("vit_small_r26_s32_384", "resnetv2_r26", 32, "small", img_size=384, tags=("augreg_in21k_ft_in1k",), **jax)
    _add("vit_base_r26_s32_224", "resnetv2_r26", 32, "base", **jax)
    _add("vit_base_r50_s16_224", "resnetv2_r50_s16", 16, "base", tags=("orig_in21k",), num_classes=0,
         **jax)  # headless, as timm's (its only weights are the original in21k ones, without a head)
    _add("vit_base_r50_s16_384", "resnetv2_r50_s16", 16, "base", img_size=384, tags=("orig_in21k_ft_in1k",), **jax)
    _add("vit_large_r50_s32_224", "resnetv2_r50", 32, "large", tags=("augreg_in21k_ft_in1k", "augreg_in21k"), **jax)
    _add("vit_large_r50_s32_384", "resnetv2_r50", 32, "large", img_size=384, tags=("augreg_in21k_ft_in1k",), **jax)
    # ResNet-D stems (BatchNorm); timm publishes no weights for these
    small = dict(embed_dim=768, depth=8, num_heads=8, mlp_ratio=3.0)  # timm's "small" hybrid: B width, 8 blocks
    imnet = dict(mean=IMAGENET_MEAN, std=IMAGENET_STD)
    _add("vit_small_resnet26d_224", "resnet26d", 32, small, **imnet)
    _add("vit_small_resnet50d_s16_224", "resnet50d_s16", 16, small, **imnet)
    _add("vit_base_resnet26d_224", "resnet26d", 32, "base", **imnet)
    _add("vit_base_resnet50d_224", "resnet50d", 32, "base", **imnet)
    # MobileCLIP-B's image tower: a 3-conv stem, no position rows for the class token, a 512-d projection head
    _add("vit_base_mci_224", "mobileclip_stem", 16, "base", prefix_pos=False, num_classes=512,
         mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), tags=("apple_mclip2_dfndr2b",),
         notes="MobileCLIP-B image tower (apple-amlr licence for the weights)")
    # Small images: a conv stem before 2x2 patches on its stride-2 map (patch_size 4 in pixels, 7x7 / 8x8 tokens)
    for res, chans, data in ((28, 1, "(Fashion-)MNIST"), (32, 3, "CIFAR-like")):
        for name, embed, convs in (("conv", "conv_small", "two"), ("conv3", "conv_small3", "three")):
            _add(f"vit_tiny_{name}_{res}", embed, 4, dict(embed_dim=192, depth=6, num_heads=3), img_size=res,
                 in_chans=chans, num_classes=10, group="small-images", mean=(0.5,) * chans, std=(0.5,) * chans,
                 crop_pct=1.0, interpolation="bilinear",
                 notes=f"for {res}x{res} {data}: {convs} 3x3 conv layers (the first at stride 2) before 2x2 patches")


_register()
