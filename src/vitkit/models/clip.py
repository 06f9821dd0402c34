"""The `clip` family: CLIP (Radford et al. 2021), an image tower and a text tower meeting in one embedding space.

- `visual`: the `vit` family's VisionTransformer (OpenAI layout: pre-norm, no patch bias, class-token pooling
  after the final norm) whose head is the image projection (width -> embed_dim, bias zero for imported weights).
- `text`: token + position embeddings, pre-norm blocks with a causal mask (token i attends to 0..i), a final
  LayerNorm, the features at the end-of-text token (the largest id of each row, as CLIP's tokenizer gives EOT
  the last id) and a projection to embed_dim without bias.
- `logit_scale`: a learned temperature; logits are exp(logit_scale) * cos(image, text).

Key names: `visual.*` are the ViT's; the text tower uses the same block names (`text.blocks.{i}.norm1`,
`attn.qkv`, `mlp.fc1`, ...), so OpenAI/open_clip checkpoints map through one rename table (the family's layout,
weights/importers/clip_text.py): `vitkit.load_model` of such a file is the whole pair; `tower="image"` (or
`.visual`) the image tower alone. Both towers share the activation (`vision.act`: quick_gelu for OpenAI's
weights, gelu for most open_clip ones) and LayerNorm eps, as open_clip's one `quick_gelu` switch does.

As a VitkitModel the image side is the model: `forward_features`/`forward_head` run the image tower,
`forward_head(pre_logits=True)` is the (unnormalised) image embedding, and a classifier head (`head`, on the
L2-normalised embedding) is either trained or set from text by `set_classifier` (zero-shot, vitkit.zeroshot).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..layers import Attention, Block
from ..layers.attention import sdpa_is_slower
from .config import ACTS, CLIP_MEAN, CLIP_STD, Preprocess, ViTConfig
from .registry import Pretrained, register_family, register_model
from .towers import ImageTowerModel, TowerConfig
from .vision_transformer import VisionTransformer


def clip_vision(width: int = 768, depth: int = 12, patch_size: int = 32, img_size: int = 224, **kw: Any) -> ViTConfig:
    """A CLIP image tower in the OpenAI layout; heads are 64 wide unless `num_heads` says otherwise."""
    kw = dict(num_heads=max(1, width // 64), act="quick_gelu") | kw
    return ViTConfig(img_size=img_size, patch_size=patch_size, embed_dim=width, depth=depth, pre_norm=True,
                     patch_bias=False, norm_eps=1e-5, global_pool="token", **kw)


@dataclass
class ClipConfig(TowerConfig):
    _what = "CLIP config"
    tower_field = "vision"  # the image tower; the text tower's fields are this config's own

    embed_dim: int = 512  # the joint image-text space (width of both projections)
    vision: ViTConfig = field(default_factory=clip_vision)  # its num_classes is always embed_dim (the projection)
    context_length: int = 77
    vocab_size: int = 49408
    text_width: int = 512
    text_heads: int = 8
    text_layers: int = 12
    text_mlp_ratio: float = 4.0
    init_logit_scale: float = math.log(1 / 0.07)
    num_classes: int = 0  # a classifier on the normalised image embedding (zero-shot or trained); 0: none

    def __post_init__(self):
        super().__post_init__()
        if self.vision.num_classes != self.embed_dim:  # the image projection is the tower's head
            self.vision = dataclasses.replace(self.vision, num_classes=self.embed_dim)

        def need(cond: bool, msg: str):
            if not cond:
                raise ConfigError(msg)

        need(self.embed_dim > 0, f"embed_dim must be positive, got {self.embed_dim}")
        need(self.context_length >= 2, f"context_length must be at least 2, got {self.context_length}")
        need(self.vocab_size > 0, f"vocab_size must be positive, got {self.vocab_size}")
        need(self.text_width > 0 and self.text_heads > 0 and self.text_layers >= 0,
             "text_width and text_heads must be positive, text_layers >= 0")
        need(self.text_width % self.text_heads == 0,
             f"text_width {self.text_width} is not divisible by text_heads {self.text_heads}")
        need(self.num_classes >= 0, f"num_classes must be >= 0, got {self.num_classes}")
        need(self.vision.act in ACTS, f"act must be one of {ACTS}")


class CausalAttention(Attention):
    """Self-attention in which token i sees tokens 0..i only (CLIP's text tower)."""

    def forward(self, x: torch.Tensor, return_attn: bool = False, rope=None, bias=None):
        # the Block hands every attention its rotary / relative-position inputs; the text tower has neither
        assert rope is None and bias is None, "CLIP's text attention takes no rotary or bias input"
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, H, N, Dh]
        q, k = self.q_norm(q), self.k_norm(k)
        attn = None
        if self.fused and not return_attn and not sdpa_is_slower(q):
            x = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            scores = (q * self.scale) @ k.transpose(-2, -1)  # [B, H, N, N]
            future = torch.ones(N, N, dtype=torch.bool, device=x.device).triu(1)
            attn = self.attn_map(scores.masked_fill(future, float("-inf")).softmax(dim=-1))
            x = self.attn_drop(attn) @ v  # [B, H, N, Dh]
        x = self.proj_drop(self.proj(x.transpose(1, 2).reshape(B, N, D)))
        return (x, attn) if return_attn else x


class CausalBlock(Block):
    """The pre-norm Block with causal attention (same parameter names)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, act: str, eps: float):
        super().__init__(dim, num_heads, mlp_ratio, act=act, eps=eps)
        self.attn = CausalAttention(dim, num_heads, eps=eps)
        self.native_fastpath = False  # torch's fused encoder kernel would run without the mask


class TextTransformer(nn.Module):
    """Token ids [B, L] (L <= context_length) -> text embedding [B, embed_dim]."""

    def __init__(self, cfg: ClipConfig):
        super().__init__()
        W, act, eps = cfg.text_width, cfg.vision.act, cfg.vision.norm_eps
        self.context_length = cfg.context_length
        self.token_embed = nn.Embedding(cfg.vocab_size, W)
        self.pos_embed = nn.Parameter(torch.zeros(cfg.context_length, W))
        self.blocks = nn.Sequential(*[CausalBlock(W, cfg.text_heads, cfg.text_mlp_ratio, act, eps)
                                      for _ in range(cfg.text_layers)])
        self.norm = nn.LayerNorm(W, eps=eps)
        self.proj = nn.Linear(W, cfg.embed_dim, bias=False)
        self.init_weights()

    def init_weights(self) -> None:
        """CLIP's initialisation: embeddings N(0, .02) / N(0, .01); attention and MLP weights scaled by width and
        depth (the residual projections by (2 * layers) ** -0.5 more); the text projection by width ** -0.5."""
        W, L = self.token_embed.embedding_dim, max(len(self.blocks), 1)
        nn.init.normal_(self.token_embed.weight, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.01)
        attn_std, proj_std, fc_std = W**-0.5, W**-0.5 * (2 * L) ** -0.5, (2 * W) ** -0.5
        for blk in self.blocks:
            nn.init.normal_(blk.attn.qkv.weight, std=attn_std)
            nn.init.normal_(blk.attn.proj.weight, std=proj_std)
            nn.init.normal_(blk.mlp.fc1.weight, std=fc_std)
            nn.init.normal_(blk.mlp.fc2.weight, std=proj_std)
            for lin in (blk.attn.qkv, blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2):
                nn.init.zeros_(lin.bias)
        nn.init.normal_(self.proj.weight, std=W**-0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.ndim != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise ConfigError(f"text ids must be an integer tensor [batch, tokens], got {ids.dtype} {tuple(ids.shape)}")
        B, L = ids.shape
        if L > self.context_length or L < 1:
            raise ConfigError(f"{L} tokens per text; this text tower takes 1..{self.context_length}")
        x = self.token_embed(ids) + self.pos_embed[:L]  # [B, L, W]
        x = self.norm(self.blocks(x))
        eot = ids.argmax(dim=-1)  # [B]: EOT has the largest id of CLIP's vocabulary
        return self.proj(x[torch.arange(B, device=x.device), eot])  # [B, E]


class ClipModel(ImageTowerModel):
    image_attr = "visual"  # the model protocol is the image tower's (models/towers.py), but for the classifier
    head_names = ("head",)  # the classifier on the image embedding (`visual.head` is the image projection)
    # the image tower has attention maps and a position table, but the commands that use them run a ViT's
    # own forward (return_attn, token masks), which this model does not expose; its feature maps it does, and
    # the text side (zero-shot)
    capabilities = frozenset({"intermediates", "encode_text"})
    towers = {"image": ("visual", "vision")}  # name -> (module, config field): load_model(path, tower="image")

    def __init__(self, cfg: ClipConfig | None = None, *, preprocess: Preprocess | None = None, class_names=None,
                 provenance=None, **overrides):
        super().__init__()
        cfg = cfg or ClipConfig()
        cfg = cfg.replace(**overrides) if overrides else cfg
        self.cfg = cfg
        self.num_classes = cfg.num_classes
        self.num_features = self.embed_dim = cfg.embed_dim
        pre = preprocess or Preprocess(CLIP_MEAN, CLIP_STD, "bicubic", 1.0)
        self.preprocess = dataclasses.replace(pre, input_size=(cfg.in_chans, *cfg.img_size)).for_channels(cfg.in_chans)
        self.class_names = list(class_names) if class_names else None
        self.provenance = dict(provenance or {})
        self.visual = VisionTransformer(cfg.vision, preprocess=self.preprocess)
        with torch.no_grad():
            self.visual.head.bias.zero_()  # CLIP's image projection has no bias; it starts at zero
        self.text = TextTransformer(cfg)
        self.logit_scale = nn.Parameter(torch.tensor(float(cfg.init_logit_scale)))
        self.head = self._new_head(cfg.num_classes)

    def _new_head(self, num_classes: int) -> nn.Module:
        if not num_classes:
            return nn.Identity()
        head = nn.Linear(self.embed_dim, num_classes, device=self.logit_scale.device)
        nn.init.trunc_normal_(head.weight, std=0.02)
        nn.init.zeros_(head.bias)
        return head

    # ------------------------------------------------------------------ the two towers
    def encode_image(self, images: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """Images [B, C, H, W] (preprocessed) -> image embeddings [B, E]."""
        emb = self.forward_head(self.forward_features(images), pre_logits=True)
        return F.normalize(emb, dim=-1) if normalize else emb

    def encode_text(self, ids: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """Token ids [B, L] (vitkit.text.tokenize) -> text embeddings [B, E]."""
        emb = self.text(ids)
        return F.normalize(emb, dim=-1) if normalize else emb

    def clip_logits(self, images: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits_per_image [B, T], logits_per_text [T, B]): exp(logit_scale) * cosine similarity."""
        img, txt = self.encode_image(images, normalize=True), self.encode_text(ids, normalize=True)
        logits = self.logit_scale.exp() * img @ txt.t()  # [B, T]
        return logits, logits.t()

    # ------------------------------------------------------------------ the classifier on the image embedding
    # (forward_features, the feature contract, grad checkpointing and checkpoint adaptation: the image tower's)
    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> the image embedding [B, E] (`pre_logits`, or no classifier) or the classifier's logits
        [B, K] on the L2-normalised embedding."""
        emb = self.visual.forward_head(x)  # class token @ projection: [B, E]
        if pre_logits or not self.num_classes:
            return emb
        return self.head(F.normalize(emb, dim=-1))

    def forward(self, images: torch.Tensor, ids: torch.Tensor | None = None):
        """Images alone: the image side's output (classifier logits, or embeddings without a classifier).
        With text ids: (logits_per_image, logits_per_text), as CLIP's forward."""
        if ids is not None:
            return self.clip_logits(images, ids)
        return self.forward_head(self.forward_features(images))

    def set_classifier(self, class_embeddings: torch.Tensor, class_names: list[str] | None = None) -> None:
        """Make the classifier the zero-shot one: logits = exp(logit_scale) * cos(image, class embedding), from
        L2-normalised class embeddings [K, E] (vitkit.zeroshot.build_classifier)."""
        K, E = class_embeddings.shape
        if E != self.embed_dim:
            raise ConfigError(f"class embeddings are {E} wide; this model's embedding is {self.embed_dim}")
        if class_names is not None and len(class_names) != K:
            raise ConfigError(f"{len(class_names)} class names for {K} class embeddings")
        head = nn.Linear(E, K, device=self.logit_scale.device, dtype=self.logit_scale.dtype)
        with torch.no_grad():
            head.weight.copy_(self.logit_scale.exp() * class_embeddings.to(head.weight))
            head.bias.zero_()
        self.head, self.num_classes = head, K
        self.cfg = self.cfg.replace(num_classes=K)
        self.class_names = list(class_names) if class_names is not None else None

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool not in (None, self.cfg.vision.global_pool):
            raise ConfigError("a CLIP model pools its image tower as it was trained (its projection expects it)")
        self.head = self._new_head(num_classes)
        self._classes_changed(num_classes)

    def get_classifier(self) -> nn.Module:
        return self.head

    def no_weight_decay(self) -> set[str]:
        return super().no_weight_decay() | {"text.pos_embed", "logit_scale"}

    def group_matcher(self, coarse: bool = False) -> dict:
        """Embeddings of both towers first, then block i of either tower in group i, then the final norms and
        projections; the classifier (`head`) is unmatched, so last."""
        return {
            "stem": r"^visual\.(?:cls_token|pos_embed|patch_embed|norm_pre)|^text\.(?:token_embed|pos_embed)|^logit_scale",
            "blocks": [(r"^(?:visual|text)\.blocks\.(\d+)", None),
                       (r"^visual\.(?:norm|fc_norm|head)|^text\.(?:norm|proj)", (99999,))],
        }


register_family("clip", ClipConfig, ClipModel)

_CLIP = dict(group="clip", mean=CLIP_MEAN, std=CLIP_STD, crop_pct=1.0, interpolation="bicubic")


def _openai(timm_name: str) -> dict[str, Pretrained]:
    """OpenAI's weights of a pair: open_clip's file of it in timm's hub repo (weights/importers/clip_text.py)."""
    return {"openai": Pretrained(hub=f"timm/{timm_name}.openai", license="mit")}


# OpenAI's three ViT CLIPs (open_clip's ViT-B-32, ViT-B-16, ViT-L-14 with quick_gelu).
register_model("clip_vit_base_patch32", "clip", ClipConfig(embed_dim=512, vision=clip_vision(768, 12, 32)),
               notes="OpenAI CLIP ViT-B/32 (open_clip ViT-B-32-quickgelu): image and text towers",
               pretrained=_openai("vit_base_patch32_clip_224"), **_CLIP)
register_model("clip_vit_base_patch16", "clip", ClipConfig(embed_dim=512, vision=clip_vision(768, 12, 16)),
               notes="OpenAI CLIP ViT-B/16 (open_clip ViT-B-16-quickgelu): image and text towers",
               pretrained=_openai("vit_base_patch16_clip_224"), **_CLIP)
register_model("clip_vit_large_patch14", "clip",
               ClipConfig(embed_dim=768, vision=clip_vision(1024, 24, 14), text_width=768, text_heads=12),
               notes="OpenAI CLIP ViT-L/14 (open_clip ViT-L-14-quickgelu): image and text towers",
               pretrained=_openai("vit_large_patch14_clip_224"), **_CLIP)
# A few-hundred-thousand-parameter pair (plus the 49,408-row token table) for tests and examples.
register_model("clip_vit_tiny_test", "clip",
               ClipConfig(embed_dim=32, vision=clip_vision(32, 2, 8, img_size=32, num_heads=2), text_width=32,
                          text_heads=2, text_layers=2),
               notes="tiny CLIP pair (32 px, patch 8, width 32, 2+2 layers) for tests; random weights", **_CLIP)
