"""Dynamic batching: concurrent requests share one model call.

One worker thread per batcher makes the model calls, so the event loop never runs the model. The server
runs one batcher per operation on one model; they share one `run_lock`, so the model never runs twice at
once across operations either (bounded memory, and torch's own threads are not oversubscribed): the
threads are one per operation, the model calls one at a time. The worker
takes the first waiting request, then keeps taking requests until it has `max_batch` of them or
`timeout_ms` has passed since the first, and runs them as one batch. Requests that arrived while the
previous batch ran are already waiting, so under load batches fill without any waiting at all. With
`expecting` (how many requests are on their way: received, still being decoded), the worker waits only
while some are: a lone client never pays the timeout. `max_batch=1` turns batching off (one call per
request, in arrival order).

Every submitted item gets exactly one answer on its own Future: its result, or its own exception. When a
batch call fails, its items are re-run one by one so that one bad item's error reaches only its request.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..errors import VitkitError


class BusyError(VitkitError):
    """The queue is full or the batcher is stopped: the request is refused at once, not queued."""


@dataclass
class _Job:
    item: Any
    future: Future = field(default_factory=Future)


_STOP = object()


class Batcher:
    """Run `run_batch(items) -> results` (same length and order) on groups of submitted items."""

    def __init__(self, run_batch: Callable[[list[Any]], Sequence[Any]], max_batch: int = 16,
                 timeout_ms: float = 5.0, max_queue: int = 1024, name: str = "vitkit-batcher",
                 expecting: Callable[[], int] | None = None, run_lock: threading.Lock | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be at least 0, got {timeout_ms}")
        self.run_batch, self.max_batch, self.timeout_s = run_batch, max_batch, timeout_ms / 1000.0
        self.max_queue, self.name, self.expecting = max_queue, name, expecting
        # held around every run_batch call; batchers that share one model share one lock
        self.run_lock = run_lock if run_lock is not None else threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closing = False
        self.stats = {"requests": 0, "batches": 0, "largest_batch": 0}

    def start(self) -> None:
        """Start the worker (again, after close); a no-op while it runs."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive() and not self._closing:
                return
            if self._thread is not None:
                self._thread.join()  # a closing worker drains its queue first
            self._closing = False
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    def submit(self, item: Any) -> Future:
        """Queue `item`; its Future gets the result. BusyError when the queue is full or the batcher stopped."""
        if self._thread is None:
            self.start()
        with self._lock:
            if self._closing:
                raise BusyError("the server is shutting down")
            if self._queue.qsize() >= self.max_queue:
                raise BusyError(f"the server is busy ({self.max_queue} requests waiting): try again shortly")
            job = _Job(item)
            self._queue.put(job)
        return job.future

    def waiting(self) -> int:
        """How many requests are queued, not yet taken into a batch (what /health reports)."""
        return self._queue.qsize()

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests; everything already queued is still answered before the worker exits."""
        with self._lock:
            if self._thread is None or self._closing:
                return
            self._closing = True
            self._queue.put(_STOP)
        self._thread.join(timeout)

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            deadline = time.monotonic() + self.timeout_s
            while len(batch) < self.max_batch:
                remaining = deadline - time.monotonic()
                if self.expecting is not None and not self.expecting():
                    remaining = 0  # nobody else is coming: take what is waiting, wait for nothing
                try:  # past the deadline, still take what is already waiting (it arrived during the last batch)
                    job = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is _STOP:
                    stop = True  # answer this batch, then exit (the queue is empty behind the sentinel)
                    break
                batch.append(job)
            self._run([j for j in batch if j.future.set_running_or_notify_cancel()])  # skip cancelled ones

    def _run(self, batch: list[_Job]) -> None:
        if not batch:
            return
        self.stats["requests"] += len(batch)
        self.stats["batches"] += 1
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch))
        try:
            with self.run_lock:
                results = list(self.run_batch([j.item for j in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"{self.name}: {len(batch)} items gave {len(results)} results")
        except Exception as e:  # noqa: BLE001  every error goes back to a request, none kills the worker
            if len(batch) == 1:
                batch[0].future.set_exception(e)
                return
            for job in batch:  # find whose item failed: each request gets its own answer
                try:
                    with self.run_lock:
                        result = self.run_batch([job.item])[0]
                    job.future.set_result(result)
                except Exception as single:  # noqa: BLE001
                    job.future.set_exception(single)
            return
        for job, result in zip(batch, results):
            job.future.set_result(result)
