"""What a ViT costs in closed form, from its config alone: parameters, MACs, training activation memory.
(The formulas, with what they count and leave out, are in vitkit.analysis.cost's docstring; vitkit.analysis
builds the full report on these.)"""
from __future__ import annotations

from .config import ViTConfig

PARAM_PARTS = ("patch_embed", "attention", "mlp", "norms", "pos_prefix", "head")
MAC_PARTS = ("patch_embed", "attn_proj", "attn_scores", "mlp", "head")


def param_counts(cfg: ViTConfig) -> dict[str, int]:
    """Parameters by part (see the module docstring); matches the named parameters of VisionTransformer(cfg)."""
    C, p, D, L = cfg.in_chans, cfg.patch_size, cfg.embed_dim, cfg.depth
    Hm, Dh = int(D * cfg.mlp_ratio), D // cfg.num_heads
    N, P = cfg.grid_size[0] * cfg.grid_size[1], cfg.num_prefix_tokens
    layer_scale = D if cfg.init_values else 0
    attn = 3 * D * D + (3 * D if cfg.qkv_bias else 0) + D * D + D + (4 * Dh if cfg.qk_norm else 0) + layer_scale
    mlp = _mlp_params(cfg.mlp_layer, D, Hm) + layer_scale
    final_norms = 2 * D if cfg.final_norm else 0  # `norm` or `fc_norm`, never both
    pos_rows = 0 if cfg.pos_embed == "none" else N + (P if cfg.prefix_pos else 0)
    feat, K = cfg.representation_size or D, cfg.num_classes
    head = (feat * K + K if K else 0) * (2 if cfg.distilled else 1)
    if cfg.representation_size:
        head += D * feat + feat
    if cfg.global_pool == "map":  # latent, q, kv, proj, norm and MLP of the attention-pooling head
        b = 3 * D if cfg.qkv_bias else 0
        head += D + 3 * D * D + b + D * D + D + 2 * D + _mlp_params("mlp", D, Hm)
    return {
        "patch_embed": C * p * p * D + (D if cfg.patch_bias else 0),
        "attention": L * attn,
        "mlp": L * mlp,
        "norms": L * 4 * D + (2 * D if cfg.pre_norm else 0) + final_norms,
        "pos_prefix": pos_rows * D + P * D + (D if cfg.mask_token else 0),
        "head": head,
    }


def mac_counts(cfg: ViTConfig) -> dict[str, int]:
    """Forward multiply-accumulates per image by part (matmuls and the patch conv only)."""
    C, p, D, L = cfg.in_chans, cfg.patch_size, cfg.embed_dim, cfg.depth
    Hm = int(D * cfg.mlp_ratio)
    N = cfg.grid_size[0] * cfg.grid_size[1]
    T = N + cfg.num_prefix_tokens
    feat, K = cfg.representation_size or D, cfg.num_classes
    # DeiT distilled: pre_logits and a head for both the class and the distillation token
    head = (feat * K + (D * feat if cfg.representation_size else 0)) * (2 if cfg.distilled else 1)
    if cfg.global_pool == "map":  # one query: q and proj D^2, kv 2 N D^2, scores 2 N D, MLP 2 D Hm
        head += 2 * D * D + 2 * N * D * D + 2 * N * D + _mlp_macs("mlp", D, Hm)
    return {
        "patch_embed": N * C * p * p * D,
        "attn_proj": L * T * 4 * D * D,  # qkv (3 D^2) + proj (D^2) per token
        "attn_scores": L * 2 * T * T * D,  # QK^T and AV: T^2 * Dh per head each, times H heads
        "mlp": L * T * _mlp_macs(cfg.mlp_layer, D, Hm),
        "head": head,
    }


def _mlp_params(kind: str, D: int, Hm: int) -> int:
    if kind == "swiglu":  # fc1_g, fc1_x: D -> Hm each; fc2: Hm -> D
        return 2 * (D * Hm + Hm) + Hm * D + D
    if kind == "swiglu_packed":  # fc1: D -> Hm (both halves); fc2: Hm/2 -> D
        return D * Hm + Hm + Hm // 2 * D + D
    return D * Hm + Hm + Hm * D + D


def _mlp_macs(kind: str, D: int, Hm: int) -> int:
    """Per token."""
    return {"swiglu": 3 * D * Hm, "swiglu_packed": D * Hm + Hm // 2 * D}.get(kind, 2 * D * Hm)


def activation_elements(cfg: ViTConfig, fused_attention: bool = True) -> int:
    """Elements autograd saves for backward in one training forward of one image (formula in the docstring).
    Modelled for the GELU MLP and token/avg/max pooling; SwiGLU MLPs and the MAP head are counted as if
    they were those (not checked against autograd)."""
    D, L, H = cfg.embed_dim, cfg.depth, cfg.num_heads
    Hm = int(D * cfg.mlp_ratio)
    T = cfg.grid_size[0] * cfg.grid_size[1] + cfg.num_prefix_tokens
    block = 8 * T * D + 2 * T * Hm + 4 * T + (H * T if fused_attention else H * T * T)
    if cfg.qk_norm:
        # normalised q and k are new tensors (+ stats); the attention output then comes back in head-major
        # layout, so the [B, T, D] input of proj is a copy
        block += 3 * T * D + 4 * H * T
    if cfg.init_values:
        block += 2 * T * D  # LayerScale keeps the branch outputs
    stem = cfg.in_chans * cfg.img_size[0] * cfg.img_size[1] + ((T * D + 2 * T) if cfg.pre_norm else 0)
    token_norm = cfg.final_norm and not cfg.use_fc_norm
    tail = T * D + 2 * T if token_norm else 0  # final norm: its input and stats
    # what pooling leaves for the next layer: the class token is a view of all final tokens; amax keeps its
    # input and output; a mean keeps nothing but its output is the next input
    tail += {"token": T * D, "max": T * D + D}.get(cfg.global_pool, D)
    if cfg.final_norm and cfg.use_fc_norm:
        tail += D + 2  # fc_norm output and stats
    if cfg.representation_size:
        tail += cfg.representation_size * (2 if cfg.distilled else 1)  # tanh outputs
    return stem + L * block + tail


def vit_cost(cfg: ViTConfig) -> dict[str, dict[str, int]]:
    """The `vit` family's closed-form cost: {"params": by part, "macs": forward MACs per image by part}."""
    return {"params": param_counts(cfg), "macs": mac_counts(cfg)}
