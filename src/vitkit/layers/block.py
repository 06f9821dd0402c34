"""The transformer block: pre-norm x + attn(norm1(x)), then x + mlp(norm2(x)) (post-norm: x + norm1(attn(x)), ...)."""
from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .mlp import Mlp, hooked, mlp_needs_grid
from .rel_pos import RelPosMlp
from .tome import TokenMatch, merge_wavg


class LayerScale(nn.Module):
    """Per-channel learnable scale of a residual branch (CaiT / DeiT III / DINOv2)."""

    def __init__(self, dim: int, init_values: float = 1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth: drop a sample's whole residual branch with probability p during training."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Block(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        init_values: float | None = None,
        act: str = "gelu",
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        eps: float = 1e-6,
        mlp_layer: type[nn.Module] = Mlp,  # any (dim, hidden, act=, drop=) module: Mlp, SwiGLU, ...
        k_bias: bool = True,
        rope_half: bool = False,
        post_norm: bool = False,  # x + norm(attn(x)), x + norm(mlp(x)) (timm's ResPostBlock), else pre-norm
        rel_pos_dim: int | None = None,  # hidden width of a per-block relative position MLP (layers/rel_pos.py)
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads, qkv_bias, qk_norm, attn_drop, proj_drop, eps, k_bias, rope_half)
        # a per-block relative position MLP lives on the attention, under timm's key names (attn.rel_pos.mlp.*)
        self.attn.rel_pos = RelPosMlp(num_heads, rel_pos_dim) if rel_pos_dim else None
        self.post_norm = post_norm
        layer_scale = init_values if init_values and not post_norm else None
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = mlp_layer(dim, int(dim * mlp_ratio), act=act, drop=proj_drop)
        self.mlp_needs_grid = mlp_needs_grid(mlp_layer)  # a conv MLP (layers/mlp.py) takes the grid
        self.ls2 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if post_norm and init_values:  # post-norm blocks start their norms' gains small instead (timm's init)
            nn.init.constant_(self.norm1.weight, init_values)
            nn.init.constant_(self.norm2.weight, init_values)
        # inference through torch's fused encoder-layer kernel where it computes the same thing; off (timm's
        # path) until vitkit.hardware.apply_fast_paths sets it for this machine
        self.native_fastpath = False

    def forward(self, x: torch.Tensor, return_attn: bool = False, rope: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                grid: tuple[int, int] | None = None):
        """rope: the rotary table for the patch tokens (layers/rope.py); bias: an additive attention bias
        [1, H, N, N] (layers/rel_pos.py); mask: boolean [B, 1, 1, N], False for padding keys (layers/naflex.py);
        grid: the patch tokens' (gh, gw), for an MLP that needs it (`mlp_needs_grid`)."""
        if (rope is None and bias is None and mask is None and not return_attn and self.native_fastpath
                and self._fastpath_applies(x)):
            return self._native_forward(x)
        attn_in = x if self.post_norm else self.norm1(x)
        padding = {} if mask is None else {"mask": mask}  # attention layers without padding masks (CLIP's causal one)
        if return_attn:
            y, attn = self.attn(attn_in, return_attn=True, rope=rope, bias=bias, **padding)
        else:
            y, attn = self.attn(attn_in, rope=rope, bias=bias, **padding), None
        if self.post_norm:
            x = x + self.drop_path1(self.norm1(y))
            x = x + self.drop_path2(self.norm2(self._mlp(x, grid)))
            return (x, attn) if return_attn else x
        x = x + self.drop_path1(self.ls1(y))
        x = x + self.drop_path2(self.ls2(self._mlp(self.norm2(x), grid)))
        return (x, attn) if return_attn else x

    def _mlp(self, x: torch.Tensor, grid: tuple[int, int] | None) -> torch.Tensor:
        return self.mlp(x, grid) if self.mlp_needs_grid else self.mlp(x)

    def forward_merging(self, x: torch.Tensor, size: torch.Tensor | None, r: int, prefix: int,
                        return_attn: bool = False):
        """The block with token merging (ToMe, layers/tome.py): attention with proportional attention, then the
        r most similar token pairs merged (the first `prefix` tokens never are), then the MLP on fewer tokens.
        x [B, N, D], size [B, N, 1] (None: all 1) -> (x [B, N - r, D], size [B, N - r, 1] or None while nothing
        was merged, attention probabilities [B, H, N, N] with `return_attn` else None)."""
        attn_in = x if self.post_norm else self.norm1(x)
        y, attn, keys = self.attn.forward_merging(attn_in, size, return_attn)
        x = x + self.drop_path1(self.norm1(y) if self.post_norm else self.ls1(y))
        if r:
            x, size = merge_wavg(TokenMatch(keys, r, prefix), x, size)
        if self.post_norm:
            x = x + self.drop_path2(self.norm2(self.mlp(x)))
        else:
            x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x, size, attn

    def _fastpath_applies(self, x: torch.Tensor) -> bool:
        """The fused kernel (the one nn.TransformerEncoderLayer uses) runs the whole block in one C++ call.
        In bf16 it measured 1.07x faster than the module path at batch 1-32. Its outputs are close, not
        identical: it rounds differently in bf16, and tests/test_fastpath.py checks only a max difference
        <= 5% of the largest output and cosine similarity > 0.9999 against the module path (one block of a
        tiny model). In fp32 it was no faster, so fp32 stays on the module path. Only for inference without grad,
        autocast or tracing, for the plain pre-norm block (exact GELU, biases, no qk-norm or LayerScale),
        and only when no hook waits on a submodule."""
        if x.dtype not in (torch.bfloat16, torch.float16) or self.training or torch.is_grad_enabled() or self.post_norm:
            return False
        if x.ndim != 3 or x.dtype != self.norm1.weight.dtype or torch.is_autocast_enabled(x.device.type):
            return False
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return False
        attn, mlp = self.attn, self.mlp
        plain = (
            attn.fused and isinstance(attn.q_norm, nn.Identity)
            and isinstance(self.ls1, nn.Identity) and isinstance(self.ls2, nn.Identity)
            and type(mlp) is Mlp and type(mlp.act) is nn.GELU and mlp.act.approximate == "none"
            and self.norm1.eps == self.norm2.eps
            and all(lin.bias is not None for lin in (attn.qkv, attn.proj, mlp.fc1, mlp.fc2)) and attn.q_bias is None
        )
        return plain and not hooked(*self.modules())  # the block, its children, or a global hook

    def _native_forward(self, x: torch.Tensor) -> torch.Tensor:
        attn, mlp = self.attn, self.mlp
        return torch._transformer_encoder_layer_fwd(
            x, x.shape[-1], attn.num_heads,  # [B, N, D] batch-first
            attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias,
            True, True, self.norm1.eps,  # use_gelu, norm_first
            self.norm1.weight, self.norm1.bias, self.norm2.weight, self.norm2.bias,
            mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias, None, None,  # no mask
        )
