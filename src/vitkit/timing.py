"""The one timing harness: calls timed round-robin, the order reversed every round, so a slow patch on a
shared machine hits every variant alike; a comparison is the median of the per-round ratios.

`vitkit bench` (vitkit.bench), the fast-path micro-benchmark (hardware.measure) and the scripts in
benchmarks/ all time with it.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

CLOCKS = ("wall", "cpu")


def timer(clock: str) -> Callable[[], float]:
    """`wall` (perf_counter) or `cpu` (this process's CPU time)."""
    return time.process_time if clock == "cpu" else time.perf_counter


def paired_times(fns: dict[Any, Callable[[], Any]], warmup: int, repeats: int, clock: str = "wall",
                 min_sample: float = 0.02) -> dict[Any, list[float]]:
    """Seconds per call of each fn, measured round-robin; the order reverses every round.

    A sample repeats a call that is faster than `min_sample` seconds (sized on the last warm-up call; without
    warm-up every sample is one call), so that timer resolution and scheduler noise stay small against what
    is measured."""
    now = timer(clock)
    names = list(fns)
    calls = dict.fromkeys(names, 1)
    for _ in range(warmup):
        for name in names:
            t0 = now()
            fns[name]()
            calls[name] = max(1, min(1000, int(min_sample / max(now() - t0, 1e-6))))
    times: dict[Any, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            t0 = now()
            for _ in range(calls[name]):
                fns[name]()
            times[name].append((now() - t0) / calls[name])
    return times


def paired_ratio(ref: list[float], other: list[float]) -> float:
    """Median over rounds of ref_time / other_time: > 1 means `other` is faster."""
    return statistics.median(r / o for r, o in zip(ref, other))
