"""Dynamic batching on one model runner: concurrent requests share model calls, and one thread makes them all.

A `ModelRunner` is the one worker thread that owns the model: every model call of the server (predict,
embed, search's query embedding, explain) is made on it, so the model never runs twice at once, its memory
is one batch's, and torch's intra-op threads (set once, on the runner, to `torch_threads`) are the only
threads that compute. Each operation queues its requests on its own `Batcher` (a lane: its batch size, its
wait, its queue limit, its counts); the runner serves the lane whose first request is the oldest. From that
lane it takes the first waiting request, then keeps taking requests until it has `max_batch` of them or
`timeout_ms` has passed since the first, and runs them as one batch. Requests that arrived while the
previous batch ran are already waiting, so under load batches fill without any waiting at all. With
`expecting` (how many requests are on their way: received, still being decoded), the runner waits only
while some are: a lone client never pays the timeout. `max_batch=1` turns batching off for a lane (one call
per request, in arrival order).

Every submitted item gets exactly one answer on its own Future: its result, its own exception, or a
BusyError when the runner stops before reaching it. When a batch call fails, its items are re-run one by
one so that one bad item's error reaches only its request.

A Batcher made without a runner gets a runner of its own (a one-lane worker, for use outside the server).
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..errors import VitkitError


class BusyError(VitkitError):
    """The queue is full or the runner is stopped: the request is refused at once, not queued."""


@dataclass
class _Job:
    item: Any
    order: int  # submission order across all lanes of a runner: the oldest waiting request is served first
    future: Future = field(default_factory=Future)


class Batcher:
    """Run `run_batch(items) -> results` (same length and order) on groups of submitted items, on `runner`'s
    thread (a runner of its own when none is given)."""

    def __init__(self, run_batch: Callable[[list[Any]], Sequence[Any]], max_batch: int = 16,
                 timeout_ms: float = 5.0, max_queue: int = 1024, name: str = "vitkit-batcher",
                 expecting: Callable[[], int] | None = None, runner: ModelRunner | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be at least 0, got {timeout_ms}")
        self.run_batch, self.max_batch, self.timeout_s = run_batch, max_batch, timeout_ms / 1000.0
        self.max_queue, self.name, self.expecting = max_queue, name, expecting
        self.jobs: deque[_Job] = deque()  # guarded by the runner's lock
        self.stats = {"requests": 0, "batches": 0, "largest_batch": 0}
        self.runner = runner if runner is not None else ModelRunner(name)
        self.runner.add(self)

    def start(self) -> None:
        """Start the runner (again, after close); a no-op while it runs."""
        self.runner.start()

    def submit(self, item: Any) -> Future:
        """Queue `item`; its Future gets the result. BusyError when the queue is full or the runner stopped."""
        return self.runner.submit(self, item)

    def waiting(self) -> int:
        """How many requests are queued, not yet taken into a batch (what /health reports)."""
        return len(self.jobs)

    def close(self, drain_s: float | None = None) -> None:
        """Stop the runner (every lane of a shared one): see `ModelRunner.close`."""
        self.runner.close(drain_s)

    def run(self, batch: list[_Job]) -> None:
        """Make the model call for `batch` and answer each job (on the runner's thread)."""
        if not batch:
            return
        self.stats["requests"] += len(batch)
        self.stats["batches"] += 1
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch))
        try:
            results = list(self.run_batch([j.item for j in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"{self.name}: {len(batch)} items gave {len(results)} results")
        except Exception as e:  # noqa: BLE001  every error goes back to a request, none kills the runner
            if len(batch) == 1:
                batch[0].future.set_exception(e)
                return
            for job in batch:  # find whose item failed: each request gets its own answer
                try:
                    job.future.set_result(self.run_batch([job.item])[0])
                except Exception as single:  # noqa: BLE001
                    job.future.set_exception(single)
            return
        for job, result in zip(batch, results):
            job.future.set_result(result)


class ModelRunner:
    """The one worker thread that makes every model call for the lanes (`Batcher`s) added to it.

    `torch_threads`: torch's intra-op thread count, set once on the runner's thread before its first call
    (None: left as it is). The threads that run the model are then the runner and those torch threads."""

    def __init__(self, name: str = "vitkit-model", torch_threads: int | None = None):
        self.name, self.torch_threads = name, torch_threads
        self.lanes: list[Batcher] = []
        self._cond = threading.Condition()  # guards the lanes' queues and the state below; wakes the worker
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._closing = False
        self.model_calls = 0

    @property
    def running(self) -> bool:
        """Whether the worker thread is alive (it exits once closed and its running call has returned)."""
        return self._thread is not None and self._thread.is_alive()

    def stats(self) -> dict[str, Any]:
        return {"thread": self.name, "torch_threads": self.torch_threads, "model_calls": self.model_calls}

    def add(self, lane: Batcher) -> None:
        with self._cond:
            self.lanes.append(lane)

    def start(self) -> None:
        """Start the worker (again, after close: the previous one finishes its running call first)."""
        with self._cond:
            if self.running and not self._closing:
                return
            previous = self._thread
        if previous is not None:
            previous.join()
        with self._cond:
            self._closing = False
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    def submit(self, lane: Batcher, item: Any) -> Future:
        if self._thread is None:
            self.start()  # a runner never started (a Batcher used on its own) starts on first use
        with self._cond:
            if self._closing:
                raise BusyError("the server is shutting down")
            if len(lane.jobs) >= lane.max_queue:
                raise BusyError(f"the server is busy ({lane.max_queue} requests waiting): try again shortly")
            job = _Job(item, next(self._order))
            lane.jobs.append(job)
            self._cond.notify()
        return job.future

    def close(self, drain_s: float | None = None) -> None:
        """Stop taking requests (BusyError from then on) and answer what is queued. With `drain_s`, return after
        at most that long: what is still queued then is refused with a BusyError (a model call already running
        cannot be stopped; the worker, a daemon thread, exits when it returns)."""
        with self._cond:
            if self._thread is None:
                return
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        thread.join(drain_s)
        if not thread.is_alive():
            return
        with self._cond:  # the worker takes jobs only under this lock: none is answered twice
            left = [job for lane in self.lanes for job in lane.jobs]
            for lane in self.lanes:
                lane.jobs.clear()
        for job in left:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(BusyError(f"the server stopped before this request ran (it waited "
                                                   f"{drain_s:g} s for the model): try again"))

    def _loop(self) -> None:
        if self.torch_threads is not None:
            import torch

            torch.set_num_threads(self.torch_threads)  # on this thread, before its first call: it makes them all
        while True:
            with self._cond:
                lane = self._next_lane()
                if lane is None:
                    return
                batch = self._take_batch(lane)
            if batch:
                self.model_calls += 1
            lane.run(batch)

    def _next_lane(self) -> Batcher | None:
        """The lane whose first request is the oldest, waiting for one; None once closing with nothing queued.
        Called with the lock held."""
        while True:
            ready = [lane for lane in self.lanes if lane.jobs]
            if ready:
                return min(ready, key=lambda lane: lane.jobs[0].order)
            if self._closing:
                return None
            self._cond.wait()

    def _take_batch(self, lane: Batcher) -> list[_Job]:
        """Up to `lane.max_batch` of its requests, waiting at most its timeout for more (and only while some are
        on their way or the lane cannot tell); the cancelled ones dropped. Called with the lock held."""
        batch = [lane.jobs.popleft()]
        deadline = time.monotonic() + lane.timeout_s
        while len(batch) < lane.max_batch:
            if lane.jobs:  # past the deadline too: what is waiting already arrived during the last batch
                batch.append(lane.jobs.popleft())
                continue
            remaining = deadline - time.monotonic()
            nobody_coming = lane.expecting is not None and not lane.expecting()
            if remaining <= 0 or self._closing or nobody_coming:
                break
            self._cond.wait(remaining)  # a submit wakes it
        return [job for job in batch if job.future.set_running_or_notify_cancel()]  # skip cancelled ones
