"""The convolutions' weight order for training (NCHW, timm's, or channels-last), decided on the model at hand.

Why not a micro-benchmark of a conv block, as hardware.measure does for the other paths: on a 2-core Zen 4 a bf16
Conv-BN-ReLU timed alone ran 0.57-0.78x in channels-last, while the training steps of the models that hold such
blocks ran 1.13x (fashion-mnist-conv's conv-stem ViT) and 1.20x (ResNet-18 at 28 px) faster: what pays is where
the order saves reorders between layers (a stem on a one-channel image, the flatten into tokens), which only the
whole model shows. So the trainer times a few forward + backward passes of its own task on one real batch in
both orders, once per machine and model (cached beside the fast-path decisions), and takes channels-last only
where it measured at least MEASURED_WIN faster. The model, its buffers (BatchNorm statistics) and the random
state are as before the timing, so a run's result does not depend on whether the cache held the answer.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time

import torch
from torch import nn

from ..hardware import (
    ENV_OVERRIDE,
    MEASURED_WIN,
    Decisions,
    cached_model_ratio,
    measuring,
    parse_overrides,
    set_conv_order,
)
from ..timing import paired_ratio

DECISION = "channels_last_training"
WARMUP = 1  # untimed passes per order (first-call allocation, oneDNN's primitive creation)
ROUNDS = 3  # paired rounds (one pass each order a round, the order alternating); 1 where a pass takes > SLOW_S
SLOW_S = 1.5


def has_convolutions(module: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in module.modules())


def signature(task: nn.Module, batch: tuple, bf16: bool) -> str:
    """The model and its input: parameter names and shapes, the batch's shapes, the precision and the threads."""
    shapes = [(k, tuple(v.shape)) for k, v in task.state_dict().items()]
    inputs = [tuple(t.shape) for t in batch if isinstance(t, torch.Tensor)]
    text = repr((type(task).__name__, shapes, inputs, bf16, torch.get_num_threads()))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def time_orders(task: nn.Module, batch: tuple) -> float:
    """NCHW time / channels-last time of one forward + backward of `task` on `batch` (median over paired rounds):
    > 1, channels-last is faster. Leaves the task's state, gradients, weight order and RNG as they were."""
    state = {k: v.detach().clone() for k, v in task.state_dict().items()}
    rng, was_training = torch.get_rng_state(), task.training
    times: dict[bool, list[float]] = {False: [], True: []}

    def one(channels_last: bool) -> float:
        set_conv_order(task, channels_last)  # untimed: the weights' copy is not part of a step
        t0 = time.perf_counter()
        task(batch)["loss"].backward()
        dt = time.perf_counter() - t0
        task.zero_grad(set_to_none=True)
        return dt

    try:
        task.train()
        slowest = max(one(cl) for cl in (False, True) for _ in range(WARMUP))
        for r in range(ROUNDS if slowest <= SLOW_S else 1):
            for cl in ((False, True) if r % 2 == 0 else (True, False)):
                times[cl].append(one(cl))
    finally:
        set_conv_order(task, False)
        task.load_state_dict(state)
        torch.set_rng_state(rng)
        task.train(was_training)
    return paired_ratio(times[False], times[True])


def decide(task: nn.Module, train_set, decisions: Decisions, *, batch_size: int, bf16: bool, device: torch.device,
           collate, world: int = 1) -> Decisions:
    """`decisions` with channels_last_training decided for this task: $VITKIT_FAST_PATHS where it names the path;
    off without convolutions, where measuring is off, on CUDA or with more than one process (every rank must
    hold the same order, and one timing per rank could disagree); else measured (cached)."""
    def with_(on: bool, why: str) -> Decisions:
        return dataclasses.replace(decisions, channels_last_training=on, why=decisions.why | {DECISION: why})

    if DECISION in parse_overrides(os.environ.get(ENV_OVERRIDE)):
        return decisions
    if not has_convolutions(task):
        return with_(False, "no convolutions in this model")
    off = ("measuring is off" if not measuring() else "CUDA" if device.type != "cpu"
           else f"{world} processes" if world > 1 else None)
    if off:
        return with_(False, f"{off}: timm's order (NCHW)")
    n = min(batch_size, len(train_set))
    batch = collate([train_set[i] for i in range(n)])
    sig = signature(task, batch, bf16)

    def measure() -> float:
        print("vitkit: timing this model's training step in both convolution orders once (cached per machine and "
              f"model; {ENV_OVERRIDE}={DECISION}=on|off decides instead)", file=sys.stderr, flush=True)
        return time_orders(task, batch)

    ratio, cached = cached_model_ratio(DECISION, sig, measure)
    on = ratio >= MEASURED_WIN
    return with_(on, f"measured on this model's training step{' (cached)' if cached else ''}: channels-last "
                     f"{ratio:.2f}x NCHW, {'at least' if on else 'under'} {MEASURED_WIN}x")
