"""Attention weights, attention rollout, [class]-token attention and gradient-weighted rollout.

All weights come from the model's per-call eager path (`forward(x, return_attn=True)`): nothing is
patched, no hooks are left behind, and fused attention stays the default for every other call.

Token layout is the model's: [class] [distillation] [registers...] [patches, row-major]. A map is the
class token's row over the PATCH columns, reshaped to the (Gh, Gw) grid of the input actually given
(any size the patch size divides, non-square included). Models without a class token (average pooling)
have no single "reading" token, so their map is the mean over the patch rows instead: the average
amount each patch is read by the patches, which is what the pooled feature sees.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..models import require

FUSIONS = ("mean", "max", "min")
METHODS = ("rollout", "cls-attention", "grad-rollout")


def grid_of(model, x: torch.Tensor) -> tuple[int, int]:
    """(Gh, Gw) of the patch grid for input [B, C, H, W]."""
    return model.patch_embed.grid_for(x.shape[-2], x.shape[-1])


@torch.no_grad()
def attention_weights(model, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits [B, K] and per-block attention probabilities, each [B, H, T, T] (rows sum to one)."""
    require(model, "attention_maps", "attention analysis")
    logits, attns = model(x, return_attn=True)
    return logits, attns


def fuse_heads(attn: torch.Tensor, fusion: str = "mean") -> torch.Tensor:
    """[B, H, T, T] -> [B, T, T]."""
    if fusion == "mean":
        return attn.mean(dim=1)
    if fusion == "max":
        return attn.amax(dim=1)
    if fusion == "min":
        return attn.amin(dim=1)
    raise ConfigError(f"head fusion must be one of {FUSIONS}, got {fusion!r}")


def discard_lowest(a: torch.Tensor, ratio: float, keep_col: int | None = 0) -> torch.Tensor:
    """Zero the lowest `ratio` of each row of [B, T, T], for every sample; column `keep_col` (the
    class token) is never discarded. Returns a new tensor."""
    if not 0.0 <= ratio < 1.0:
        raise ConfigError(f"discard ratio must be in [0, 1), got {ratio}")
    T = a.shape[-1]
    k = int(T * ratio)
    if k == 0:
        return a.clone()
    ranked = a.clone()
    if keep_col is not None:
        ranked[..., keep_col] = float("inf")  # never among the lowest
    idx = ranked.topk(k, dim=-1, largest=False).indices  # [B, T, k]
    return a.scatter(-1, idx, 0.0)


def rollout_matrix(attns: list[torch.Tensor], head_fusion: str = "mean", discard_ratio: float = 0.0,
                   keep_col: int | None = 0) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020): [B, T, T] joint attention of the last block's
    outputs over the input tokens. Per block: fuse heads, optionally discard, add the identity for
    the residual, renormalise each ROW to sum one; then R_l = A_l @ R_{l-1}."""
    if not attns:
        raise ConfigError("the model has no attention blocks (depth 0)")
    B, _, T, _ = attns[0].shape
    dtype = torch.float64 if attns[0].dtype == torch.float64 else torch.float32  # products of many layers
    eye = torch.eye(T, dtype=dtype, device=attns[0].device)
    result = eye.expand(B, T, T)
    for attn in attns:
        a = fuse_heads(attn.to(dtype), head_fusion)  # [B, T, T]
        if discard_ratio:
            a = discard_lowest(a, discard_ratio, keep_col)
        a = a + eye
        a = a / a.sum(dim=-1, keepdim=True)  # rows: each token's output mixes its inputs with weights summing to 1
        result = a @ result  # later block on the left: R_l = A_l R_{l-1}
    return result


def token_map(model, joint: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """[B, T, T] (or [B, H, T, T]) token-to-token matrix -> [B, (H,) Gh, Gw] map over the patches:
    the class token's row, or the mean over patch rows for a model without a class token."""
    P = model.num_prefix_tokens
    if model.cls_token is not None:
        row = joint[..., 0, P:]  # [B, (H,) N]
    else:
        row = joint[..., P:, P:].mean(dim=-2)
    return row.reshape(*row.shape[:-1], *grid)


def _rollout_map(model, attns: list[torch.Tensor], grid: tuple[int, int], head_fusion: str,
                 discard_ratio: float) -> torch.Tensor:
    """Rollout of per-block attentions [B, H, T, T] -> map [B, Gh, Gw] (the class column is never discarded)."""
    keep = 0 if model.cls_token is not None else None
    return token_map(model, rollout_matrix(attns, head_fusion, discard_ratio, keep), grid)


def attention_rollout(model, x: torch.Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0):
    """Rollout map [B, Gh, Gw] and logits [B, K] for images [B, C, H, W]."""
    logits, attns = attention_weights(model, x)
    return _rollout_map(model, attns, grid_of(model, x), head_fusion, discard_ratio), logits


def cls_attention(model, x: torch.Tensor, layer: int = -1):
    """Raw attention of one block (default the last), per head: [B, H, Gh, Gw], and logits."""
    logits, attns = attention_weights(model, x)
    return token_map(model, attns[layer], grid_of(model, x)), logits


def grad_rollout(model, x: torch.Tensor, target: int | torch.Tensor | None = None,
                 discard_ratio: float = 0.0):
    """Gradient-weighted rollout for class `target` (default: each image's predicted class).

    Per block (Chefer et al. 2021): weight each head's attention by the gradient of the target logit
    with respect to it, keep the positive part, average over heads: E_h[(dy/dA * A)^+]. That fused
    matrix then goes through the same identity + row-normalisation + product as plain rollout.
    Returns the map [B, Gh, Gw], the logits [B, K] and the target classes [B].
    """
    logits, _, fused, target = _grad_weighted_attention(model, x, target)
    return _rollout_map(model, fused, grid_of(model, x), "mean", discard_ratio), logits, target


def _grad_weighted_attention(model, x: torch.Tensor, target):
    """One forward and one gradient: logits [B, K], the attentions [B, H, T, T] per block, the same
    weighted by the target logit's gradient and clamped at zero, and the targets [B] (all detached)."""
    x = x.detach().clone().requires_grad_(True)  # a graph even if every parameter is frozen
    with torch.enable_grad():
        logits, attns = model(x, return_attn=True)  # attns are the attn_map outputs (the probabilities)
        if not getattr(model, "num_classes", 0):  # a headless model returns features, not class scores
            raise ConfigError("gradient rollout needs a model with a classification head (this one has none)")
        if target is None:
            target = logits.argmax(dim=-1)
        target = torch.as_tensor(target, device=logits.device).long().expand(logits.shape[0])
        if (target < 0).any() or (target >= logits.shape[-1]).any():
            raise ConfigError(f"class {target.tolist()} out of range for {logits.shape[-1]} classes")
        # samples are independent in eval mode, so one gradient of the sum gives every sample its own;
        # autograd.grad (not backward) leaves the parameters' .grad untouched
        grads = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), attns)
    fused = [(g * a).clamp(min=0).detach() for g, a in zip(grads, attns)]  # [B, H, T, T] each
    return logits.detach(), [a.detach() for a in attns], fused, target


def explain(model, x: torch.Tensor, method: str = "rollout", target: int | None = None,
            head_fusion: str = "mean", discard_ratio: float = 0.0):
    """One entry point: map [B, Gh, Gw], logits [B, K], per-head last-block maps [B, H, Gh, Gw].

    One forward pass for every method (grad-rollout takes its gradient from that same pass)."""
    if method not in METHODS:
        raise ConfigError(f"method must be one of {METHODS}, got {method!r}")
    grid = grid_of(model, x)
    if method == "grad-rollout":
        logits, attns, fused, _ = _grad_weighted_attention(model, x, target)
        amap = _rollout_map(model, fused, grid, "mean", discard_ratio)
    else:
        logits, attns = attention_weights(model, x)
    heads = token_map(model, attns[-1], grid)
    if method == "rollout":
        amap = _rollout_map(model, attns, grid, head_fusion, discard_ratio)
    elif method == "cls-attention":
        amap = fuse_heads(heads, head_fusion)
    return amap, logits, heads


def object_mass(model, images: torch.Tensor, background_threshold: float = 0.0,
                mask: torch.Tensor | None = None, head_fusion: str = "mean", discard_ratio: float = 0.0,
                batch_size: int = 256) -> dict:
    """How much rollout mass falls on the object, against the object's share of the image.

    images: raw pixels [N, C, H, W] in [0, 1] at the model's input size (not yet normalised). The
    object is every pixel whose channel mean exceeds `background_threshold`, or `mask` [N, H, W] if
    given. Each image's map is normalised to sum one over the patches and spread evenly over each
    patch's pixels. Returns the means over images of the mass on the object (`mass`) and of the
    object's pixel share (`share`), their ratio (`lift`; 1 = no better than uniform) and `n`.
    """
    device = next(model.parameters()).device
    pre = model.preprocess
    mean = torch.tensor(pre.mean, device=device).view(1, -1, 1, 1)
    std = torch.tensor(pre.std, device=device).view(1, -1, 1, 1)
    masses, shares = [], []
    for i in range(0, len(images), batch_size):
        raw = images[i:i + batch_size].float().to(device)
        m = (raw.mean(dim=1) > background_threshold) if mask is None else mask[i:i + batch_size].to(device).bool()
        amap, _ = attention_rollout(model, (raw - mean) / std, head_fusion, discard_ratio)  # [b, Gh, Gw]
        amap = amap / amap.sum(dim=(-2, -1), keepdim=True)
        per_pixel = F.interpolate(amap[:, None], size=raw.shape[-2:], mode="nearest")[:, 0]  # [b, H, W]
        per_pixel = per_pixel / per_pixel.sum(dim=(-2, -1), keepdim=True)  # each patch's mass spread evenly
        masses.append((per_pixel * m).sum(dim=(-2, -1)))
        shares.append(m.float().mean(dim=(-2, -1)))
    mass, share = torch.cat(masses).mean().item(), torch.cat(shares).mean().item()
    return {"mass": mass, "share": share, "lift": mass / share if share else float("nan"), "n": len(images)}
