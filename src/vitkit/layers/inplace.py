"""Inference that writes into tensors it has just made instead of allocating new ones.

A residual sum goes into its branch's fresh output ([B, N, D], two per block) and the MLP's activation into fc1's
output ([B, N, hidden]): the same arithmetic on the same values, bit for bit, with fewer and smaller allocations.
On CPU every large tensor is a fresh block from the C allocator, which hands freed memory back to the system and
page-faults it in again on the next call, so fewer allocations can be faster. Whether it is faster on this machine
is measured (`inplace_inference` in vitkit.hardware); off, the layers run timm's out-of-place ops.

It only applies where nothing else can see the overwritten tensor: without grad (autograd would need the
originals), outside autocast, tracing and compiling, and with no forward hook on any module inside it (a hook on
the attention or the MLP may keep the branch output that the sum then overwrites). A hook on the module itself is
no obstacle: its input is never written to, and its output is its own."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _nn_module


def has_hooks(module: nn.Module) -> bool:
    """Any forward (pre-)hook on the module, its children, or registered globally."""
    if _nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


def inplace_applies(module: nn.Module, x: torch.Tensor) -> bool:
    """True where `module` (switched on) may overwrite the tensors it makes from input `x` (see the module doc)."""
    if torch.is_grad_enabled() or torch.is_autocast_enabled(x.device.type) or torch.compiler.is_compiling():
        return False
    if torch.jit.is_tracing() or _nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks:
        return False
    return not any(m._forward_hooks or m._forward_pre_hooks for m in module.modules() if m is not module)


def residual_add(x: torch.Tensor, branch: torch.Tensor, inplace: bool) -> torch.Tensor:
    """x + branch, written into `branch` where `inplace` and it is the result's shape and dtype (a float add is
    commutative, so the values are the same)."""
    if inplace and branch.shape == x.shape and branch.dtype == x.dtype and branch.data_ptr() != x.data_ptr():
        return branch.add_(x)
    return x + branch


def activate(act: nn.Module, h: torch.Tensor, inplace: bool) -> torch.Tensor:
    """act(h), written into `h` where `inplace` and the activation has an in-place kernel (exact or tanh GELU,
    SiLU); any other activation runs as it is."""
    if inplace and type(act) is nn.GELU:
        return torch._C._nn.gelu_(h, approximate=act.approximate)
    if inplace and type(act) is nn.SiLU:
        return F.silu(h, inplace=True)
    return act(h)
