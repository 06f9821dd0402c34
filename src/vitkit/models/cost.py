"""What a ViT costs in closed form, from its config alone: parameters, MACs, training activation memory.
(The formulas, with what they count and leave out, are in vitkit.analysis.cost's docstring; vitkit.analysis
builds the full report on these.)"""
from __future__ import annotations

from functools import lru_cache

from .config import ViTConfig


@lru_cache(maxsize=256)
def _stem_cost(layer: str, img_size: tuple[int, int], patch_size: int, in_chans: int, D: int,
               bias: bool) -> tuple[int, int, int]:
    """(params, MACs per image, tokens) of a registered embed layer that is not the plain patch conv (a hybrid's
    CNN stem): built and run on the meta device (no memory, no compute), its MACs counted by FlopCounterMode
    (convolutions and matmuls; norms and activations are left out as everywhere here)."""
    import torch

    from ..layers import EMBED_LAYERS

    stem, params, macs = _counted_on_meta(lambda: EMBED_LAYERS[layer](img_size, patch_size, in_chans, D, bias=bias),
                                          lambda stem: stem(torch.empty(1, in_chans, *img_size)))
    return params, macs, stem.num_patches


def _counted_on_meta(build, run):
    """(module, params, MACs) of `build()` made on the meta device (no memory, no compute) and called once by
    `run(module)` under FlopCounterMode, which counts its convolutions and matmuls."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        module = build()
        with FlopCounterMode(display=False) as counter:
            run(module)
    return module, sum(p.numel() for p in module.parameters()), counter.get_total_flops() // 2


@lru_cache(maxsize=256)
def _mlp_cost(layer_cls: type, D: int, Hm: int, grid: tuple[int, int], prefix: int) -> tuple[int, int]:
    """(params, MACs per image) of one block's MLP layer on `prefix` + grid tokens, built and run on the meta
    device as a stem is: what a layer costs (SwiGLU's two branches, a depthwise conv over the patch grid, a
    registered MLP) is read from the layer itself, so nothing here names the kinds."""
    import torch

    from ..layers.mlp import mlp_needs_grid

    def run(mlp):
        tokens = torch.empty(1, prefix + grid[0] * grid[1], D)  # [1, P + N, D]
        return mlp(tokens, grid) if mlp_needs_grid(layer_cls) else mlp(tokens)

    _, params, macs = _counted_on_meta(lambda: layer_cls(D, Hm), run)
    return params, macs


def _block_mlp_cost(cfg: ViTConfig, N: int) -> tuple[int, int]:
    """(params, MACs per image) of one block's MLP of `cfg` on its N patches and its prefix tokens."""
    from ..layers import MLP_LAYERS

    grid = tuple(cfg.grid_size)
    if grid[0] * grid[1] != N:  # a stem with its own token count: the grid's shape changes no count here
        grid = (1, N)
    D = cfg.embed_dim
    return _mlp_cost(MLP_LAYERS[cfg.mlp_layer], D, int(D * cfg.mlp_ratio), grid, cfg.num_prefix_tokens)


def _pool_mlp_cost(cfg: ViTConfig) -> tuple[int, int]:
    """(params, MACs) of the attention-pooling head's MLP (always the plain one) on its one query."""
    from ..layers import Mlp

    D = cfg.embed_dim
    return _mlp_cost(Mlp, D, int(D * (cfg.pool_mlp_ratio or cfg.mlp_ratio)), (1, 1), 0)


def _stem(cfg: ViTConfig) -> tuple[int, int, int]:
    """(params, MACs, tokens) of the patch embedding: closed form for the patch conv, measured for a stem."""
    C, p, D = cfg.in_chans, cfg.patch_size, cfg.embed_dim
    if cfg.embed_layer == "patch":
        N = cfg.grid_size[0] * cfg.grid_size[1]
        return C * p * p * D + (D if cfg.patch_bias else 0), N * C * p * p * D, N
    return _stem_cost(cfg.embed_layer, tuple(cfg.img_size), p, C, D, cfg.patch_bias)

PARAM_PARTS = ("patch_embed", "attention", "mlp", "norms", "pos_prefix", "head")
MAC_PARTS = ("patch_embed", "attn_proj", "attn_scores", "mlp", "head")


def param_counts(cfg: ViTConfig) -> dict[str, int]:
    """Parameters by part (see the module docstring); matches the named parameters of VisionTransformer(cfg)."""
    D, L = cfg.embed_dim, cfg.depth
    Dh = D // cfg.num_heads
    stem_params, _, N = _stem(cfg)
    P = cfg.num_prefix_tokens
    layer_scale = D if cfg.init_values and not cfg.post_norm else 0  # post-norm: init_values sets the norms' gains
    qkv_bias = (3 if cfg.k_bias else 2) * D if cfg.qkv_bias else 0  # EVA-style: q and v biases only
    attn = 3 * D * D + qkv_bias + D * D + D + (4 * Dh if cfg.qk_norm else 0) + layer_scale
    mlp = _block_mlp_cost(cfg, N)[0] + layer_scale
    rel_mlp = 2 * cfg.rel_pos_dim + cfg.rel_pos_dim + cfg.rel_pos_dim * cfg.num_heads + cfg.num_heads
    attn += rel_mlp if cfg.rel_pos == "mlp" else 0  # a relative-position MLP per block (2 -> hidden -> heads)
    final_norms = 2 * D if cfg.final_norm else 0  # `norm` or `fc_norm`, never both
    pos_rows = 0 if cfg.pos_embed == "none" else N + (P if cfg.prefix_pos else 0)
    feat, K = cfg.representation_size or D, cfg.num_classes
    head = (feat * K + K if K else 0) * (2 if cfg.distilled else 1)
    if cfg.representation_size:
        head += D * feat + feat
    if cfg.global_pool == "map":  # latent, q, kv, proj, norm and MLP of the attention-pooling head
        b = 3 * D if cfg.qkv_bias else 0
        head += D + 3 * D * D + b + D * D + D + 2 * D + _pool_mlp_cost(cfg)[0]
    return {
        "patch_embed": stem_params,
        "attention": L * attn,
        "mlp": L * mlp,
        "norms": L * 4 * D + (2 * D if cfg.pre_norm else 0) + final_norms,
        # + RoPE-Mixed's learned frequencies (2 x depth x heads x head_dim/2; fixed rotary tables have none) and a
        # relative-position MLP shared by all blocks
        "pos_prefix": pos_rows * D + P * D + (D if cfg.mask_token else 0) + (L * D if cfg.rope == "mixed" else 0)
        + (rel_mlp if cfg.rel_pos == "mlp_shared" else 0),
        "head": head,
    }


def mac_counts(cfg: ViTConfig) -> dict[str, int]:
    """Forward multiply-accumulates per image by part (matmuls and the patch conv only; rotary tables are
    elementwise and a relative-position MLP runs once per forward, not per image: both are left out)."""
    D, L = cfg.embed_dim, cfg.depth
    _, stem_macs, N = _stem(cfg)
    T = N + cfg.num_prefix_tokens
    feat, K = cfg.representation_size or D, cfg.num_classes
    # DeiT distilled: pre_logits and a head for both the class and the distillation token
    head = (feat * K + (D * feat if cfg.representation_size else 0)) * (2 if cfg.distilled else 1)
    if cfg.global_pool == "map":  # one query: q and proj D^2, kv 2 N D^2, scores 2 N D, and its MLP
        head += 2 * D * D + 2 * N * D * D + 2 * N * D + _pool_mlp_cost(cfg)[1]
    return {
        "patch_embed": stem_macs,
        "attn_proj": L * T * 4 * D * D,  # qkv (3 D^2) + proj (D^2) per token
        "attn_scores": L * 2 * T * T * D,  # QK^T and AV: T^2 * Dh per head each, times H heads
        "mlp": L * _block_mlp_cost(cfg, N)[1],  # counted on the layer: a depthwise conv's taps on the patches too
        "head": head,
    }


def activation_elements(cfg: ViTConfig, fused_attention: bool = True) -> int:
    """Elements autograd saves for backward in one training forward of one image (formula in the docstring).
    Modelled for the GELU MLP and token/avg/max pooling; SwiGLU MLPs and the MAP head are counted as if
    they were those (not checked against autograd); a hybrid's CNN stem keeps activations that are not counted."""
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
