"""FSDP (torch's FSDP2, `fully_shard`) for models that outgrow one device: under torchrun,
`vitkit train --strategy fsdp` shards parameters, gradients and AdamW state across the ranks.

Each transformer block is one unit, then the root (patch embedding, position table, tokens, norm, head), as
torchtitan shards its models; parameters stay fp32 masters and, in bf16 runs, are computed in bf16 with fp32
gradient reduction (MixedPrecisionPolicy). Checkpoints are full state dicts gathered to rank 0, so they load
with `vitkit.load_model` and resume with DDP or FSDP alike; the optimiser state is saved in the layout of
`optimizer.state_dict()` (parameter numbers, not names).

Gloo (CPU) has an open upstream report of averaged gradients coming back summed
(https://github.com/pytorch/pytorch/issues/162338): `gradient_divisor` measures what this torch does on a
one-parameter probe, and the trainer divides the gradients by what it returns (1 when they are averaged).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import ConfigError


def _mesh(device: torch.device, world: int):
    # an explicit CPU mesh: without one, fully_shard on a machine with GPUs moves CPU params to CUDA under gloo
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world,))


def _policy(bf16: bool):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if bf16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def check_recipe(recipe) -> None:
    """Refuse, in one line, what the FSDP path does not shard yet: EMA (a second whole model) and objectives
    other than classification (their extra modules and teachers)."""
    if recipe.ema or recipe.task != "classification":
        raise ConfigError("--strategy fsdp trains the classification task without EMA for now; this recipe has "
                          f"task={recipe.task}, ema={recipe.ema} (--set ema=false)")


def units(model: nn.Module) -> list[nn.Module]:
    """The modules sharded one by one before the root: the entries of every ModuleList called `blocks`
    (ViT's model.blocks, each Swin stage's blocks)."""
    return [b for name, m in model.named_modules() if name.rpartition(".")[2] == "blocks"
            and isinstance(m, nn.ModuleList) for b in m]


def shard(model: nn.Module, device: torch.device, world: int, bf16: bool) -> nn.Module:
    """Shard `model` in place over `world` ranks (the process group must exist): each block, then the root.
    The optimiser must be built afterwards, on the sharded parameters."""
    from torch.distributed.fsdp import fully_shard

    mesh, mp = _mesh(device, world), _policy(bf16)
    for block in units(model):
        fully_shard(block, mesh=mesh, mp_policy=mp)
    # the root is gathered again at once for backward: keeping it whole saves one all-gather per step
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return model


def gradient_divisor(device: torch.device, world: int, bf16: bool) -> int:
    """What the gradients of a sharded model must still be divided by to be the mean over ranks: 1 when
    FSDP averaged them, `world` when the backend summed them. Measured with a [world, 1] weight whose local
    gradient is rank + 1 on every rank (mean (world + 1) / 2, sum world (world + 1) / 2)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if world == 1:
        return 1
    probe = nn.Linear(1, world, bias=False).to(device)
    fully_shard(probe, mesh=_mesh(device, world), mp_policy=_policy(bf16))
    x = torch.full((1, 1), float(dist.get_rank() + 1), device=device)
    probe(x).sum().backward()
    got = probe.weight.grad.full_tensor().float().mean().item()
    mean, total = (world + 1) / 2, world * (world + 1) / 2
    if abs(got - mean) < 1e-3 * mean:
        return 1
    if abs(got - total) < 1e-3 * total:
        return world
    raise RuntimeError(f"FSDP gradient reduction gave {got} on the probe, neither the mean {mean} nor the sum {total}")


def divide_grads(model: nn.Module, divisor: int) -> None:
    if divisor != 1:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(divisor)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model state dict, optimizer state dict) gathered whole on CPU on rank 0 (empty elsewhere). Every rank
    must call it (a collective). The optimizer's is in `optimizer.state_dict()`'s layout: parameters numbered
    in the order of its param groups."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=opts)
    named = get_optimizer_state_dict(model, optimizer, options=opts)
    if not named:
        return model_sd, {}
    ids = {fqn: i for i, fqn in enumerate(fqn for g in named["param_groups"] for fqn in g["params"])}
    groups = [g | {"params": [ids[f] for f in g["params"]]} for g in named["param_groups"]]
    return model_sd, {"state": {ids[f]: s for f, s in named["state"].items()}, "param_groups": groups}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict[str, torch.Tensor],
                    optim_sd: dict[str, Any]) -> None:
    """Load full state dicts (as `full_state` returns, or a DDP run's state) into a sharded model and its
    optimizer; every rank passes the whole dicts and keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_sd, options=opts)
    by_param = {p: name for name, p in model.named_parameters()}
    names = [by_param[p] for g in optimizer.param_groups for p in g["params"]]  # number -> name, in group order
    state = {names[int(i)]: s for i, s in optim_sd["state"].items()}
    groups = [g | {"params": [names[int(i)] for i in g["params"]]} for g in optim_sd["param_groups"]]
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups}, options=opts)


class SavedOptimizer:
    """A gathered optimizer state dict where `save_state` expects an optimizer (it calls `state_dict()`)."""

    def __init__(self, state: dict[str, Any]):
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state
