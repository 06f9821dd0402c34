"""Distributed setup for one process or DDP under torchrun (gloo on CPU, nccl on GPU), the collectives the
loop needs (a mean across ranks, a barrier), and Ctrl-C as a flag the ranks agree on between steps."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> Dist:
    """Join the process group torchrun describes in the environment (WORLD_SIZE, LOCAL_RANK); Dist() alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    d = Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if torch.cuda.is_available():
        torch.cuda.set_device(d.local_rank)
    return d


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_mean(values: list[float], d: Dist, device: torch.device) -> list[float]:
    """The mean of each value over the ranks (float64; the values themselves with one process)."""
    t = torch.tensor(values, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    if d.world > 1:
        dist.all_reduce(t)
        t /= d.world
    return t.tolist()


def main_value(value: int, d: Dist, device: torch.device) -> int:
    """The main process's `value` on every rank (every rank must call it): a decision made on rank 0."""
    if d.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device if device.type == "cuda" else "cpu")
    dist.broadcast(t, src=0)
    return int(t.item())


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, handled: the state is saved and the main process has said how to resume (`reported`, so the
    command line adds no second message)."""

    reported = True


class Interrupt:
    """SIGINT sets a flag the loop checks between steps (so the saved state is consistent); the loop takes the
    mean of it across ranks, so every rank stops at the same step."""

    def __init__(self):
        self.flag, self._old = False, None

    def __enter__(self):
        try:
            self._old = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread
            self._old = None
        return self

    def _handle(self, signum, frame):
        if self.flag:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.flag = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
