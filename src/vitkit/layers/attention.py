"""Multi-head self-attention with a fused (SDPA) default and an eager path that yields the weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .mlp import Linear
from .rope import apply_rope
from .tome import size_bias


class AttentionMap(nn.Module):
    """Identity on the softmax probabilities [B, H, N, N]; exists so hooks have a named place to attach.

    It only runs on the eager path (fused attention never forms the matrix): ask for weights per call
    with `return_attn=True`, or set `attn.fused = False` on a block.
    """

    def forward(self, attn: torch.Tensor) -> torch.Tensor:
        return attn


def sdpa_is_slower(q: torch.Tensor) -> bool:
    """True where two plain matmuls + softmax beat F.scaled_dot_product_attention.

    On CPU in bf16/fp16 PyTorch's flash kernel is 2-5x slower than the matmul form at ViT sequence
    lengths (forward and backward; measured with torch 2.4-2.14). Past ~1k tokens the two are even and
    the [B, H, N, N] matrix gets large, so SDPA keeps those.
    """
    return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-2] <= 1024


class Attention(nn.Module):
    # the matmul form where `sdpa_is_slower` says so, once `vitkit.hardware` turns it on for this machine (off:
    # timm's path)
    matmul_attention: bool = False
    matmul_attention_training: bool = False  # the same under grad (training), decided apart: hardware.py

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        eps: float = 1e-6,
        k_bias: bool = True,
        rope_half: bool = False,
    ):
        super().__init__()
        if dim % num_heads:
            from ..errors import ConfigError

            raise ConfigError(f"width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused = True
        self.rope_half = rope_half  # rotary pairs: channel i with i + head_dim/2 (else adjacent channels)
        # rows of qkv are ordered q | k | v, heads contiguous inside each (timm's layout). EVA-style models bias
        # q and v only (k's bias would cancel in the softmax): timm's `q_bias` / `v_bias`, counted as such.
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias and k_bias)
        self.q_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias and not k_bias else None
        self.v_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias and not k_bias else None
        self.q_norm = nn.LayerNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.rel_pos = None  # a per-block relative position module the model asks for its bias (layers/rel_pos.py)
        self.attn_drop = nn.Dropout(attn_drop)
        self.attn_map = AttentionMap()
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, return_attn: bool = False, rope: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        """x [B, N, D]; rope: rotary table [..., n, 2 Dh] for the last n tokens (the patches; see layers/rope.py);
        bias: added to the attention logits, [1, H, N, N] (a relative position bias, layers/rel_pos.py);
        mask: boolean [B, 1, 1, N], False for keys no token may attend to (padding, layers/naflex.py)."""
        q, k, v = self._heads(x, rope)
        if mask is not None:  # a padded batch: the boolean mask goes to SDPA as it is (its masked kernel)
            if bias is not None:
                raise ValueError("an attention bias and a padding mask together are not supported")
            x, attn = self._attend(q, k, v, return_attn, mask, bias_in_sdpa=True)
            return (x, attn) if return_attn else x
        # with a bias, the matmul form: torch 2.14's ONNX export mis-strides SDPA's output given a float mask
        x, attn = self._attend(q, k, v, return_attn, bias, bias_in_sdpa=False)
        return (x, attn) if return_attn else x

    def forward_merging(self, x: torch.Tensor, size: torch.Tensor | None, return_attn: bool = False):
        """Attention for token merging (layers/tome.py): x [B, N, D] with each token's size [B, N, 1] (None: all 1).
        Proportional attention adds log(size) to every key's logits, as an SDPA mask on the fused path.
        Returns (output [B, N, D], probabilities [B, H, N, N] or None, the keys averaged over heads [B, N, Dh]:
        what the merge matches tokens by)."""
        q, k, v = self._heads(x, None)
        x, attn = self._attend(q, k, v, return_attn, size_bias(size), bias_in_sdpa=True)
        return x, attn, k.mean(1)

    def _heads(self, x: torch.Tensor, rope: torch.Tensor | None):
        """x [B, N, D] -> q, k, v, each [B, H, N, Dh] (q and k normalised and rotated where the model does)."""
        B, N, D = x.shape
        if self.q_bias is None:
            qkv = self.qkv(x)
        else:
            qkv = F.linear(x, self.qkv.weight, torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias]))
        qkv = qkv.reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, H, N, Dh]
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # prefix tokens (class, registers) keep their channels
            P = N - rope.shape[-2]
            q = torch.cat([q[:, :, :P], apply_rope(q[:, :, P:], rope, self.rope_half)], dim=2)
            k = torch.cat([k[:, :, :P], apply_rope(k[:, :, P:], rope, self.rope_half)], dim=2)
        return q, k, v

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_attn: bool,
                bias: torch.Tensor | None, bias_in_sdpa: bool):
        """Heads [B, H, N, Dh] -> (projected output [B, N, D], probabilities [B, H, N, N] or None); `bias` is added
        to the logits (any shape broadcasting to [B, H, N, N]), inside SDPA only where `bias_in_sdpa`; a boolean
        `bias` is a mask (False: that logit is -inf), as SDPA reads one."""
        B, H, N, Dh = q.shape
        attn = None
        matmul = self.matmul_attention_training if torch.is_grad_enabled() else self.matmul_attention
        fused = self.fused and not return_attn and not (matmul and sdpa_is_slower(q))
        if fused and (bias is None or bias_in_sdpa):
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                               dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)  # [B, H, N, N]
            if bias is not None and bias.dtype == torch.bool:
                attn = attn.masked_fill(~bias, float("-inf"))
            elif bias is not None:
                attn = attn + bias
            attn = self.attn_map(attn.softmax(dim=-1))
            x = self.attn_drop(attn) @ v  # [B, H, N, Dh]
        x = x.transpose(1, 2).reshape(B, N, H * Dh)
        return self.proj_drop(self.proj(x)), attn
