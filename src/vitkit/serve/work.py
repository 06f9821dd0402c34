"""The server's model work: one `ModelRunner` (the thread that owns the model) and one `Batcher` per
operation on it (predict, embed, search and detect batched across concurrent requests; explain one at a time), with
the requests on their way counted so that a batch waits only while more are coming.

`answer(op, item)` is how an endpoint gets its result: a model that does not answer in time is a BusyError
(503); a model call that fails for another reason than the request's own mistake is a `ModelFailed` (500)
for that request alone, its details in the server log, never in the answer."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from ..errors import VitkitError
from .batching import Batcher, BusyError, ModelRunner
from .service import ModelService

log = logging.getLogger("vitkit.serve")

BATCHED = ("predict", "embed", "search", "detect")  # the operations whose requests share model calls


class ModelFailed(VitkitError):
    """A model call raised an error that is not a refusal of the request (out of memory, a bug): a fault of
    the server, answered as a 500 to that request alone."""


class ModelWork:
    """Every model call of one server, on one runner thread with `torch_threads` torch threads."""

    def __init__(self, service: ModelService, *, max_batch: int, batch_timeout_ms: float, max_queue: int,
                 request_timeout_s: float, torch_threads: int):
        self.request_timeout_s = request_timeout_s
        self.runner = ModelRunner("vitkit-model", torch_threads)
        self.arriving = dict.fromkeys(BATCHED, 0)  # received, not yet queued (the event loop's count)
        runs = {"predict": service.predict_batch, "embed": service.embed_batch, "search": service.search_batch,
                "detect": service.detect_batch}
        self.batchers = {op: Batcher(runs[op], max_batch, batch_timeout_ms, max_queue, f"vitkit-{op}",
                                     expecting=lambda op=op: self.arriving[op], runner=self.runner)
                         for op in BATCHED}
        self.batchers["explain"] = Batcher(lambda jobs: [service.explain_png(*job) for job in jobs], 1, 0,
                                           max_queue, "vitkit-explain", runner=self.runner)

    def start(self) -> None:
        self.runner.start()

    def close(self, drain_s: float | None = None) -> None:
        """Refuse new work, answer the queued work (refusing what is left after `drain_s`)."""
        self.runner.close(drain_s)

    @contextlib.contextmanager
    def on_its_way(self, op: str) -> Iterator[None]:
        """Count a request of a batched operation as arriving while it is read and decoded."""
        self.arriving[op] += 1
        try:
            yield
        finally:
            self.arriving[op] -= 1

    async def answer(self, op: str, item: Any) -> Any:
        """The result of `op` on `item`, computed on the runner."""
        future = self.batchers[op].submit(item)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.request_timeout_s)
        except asyncio.TimeoutError:
            future.cancel()
            raise BusyError(f"the model did not answer within {self.request_timeout_s:g} s: try again") from None
        except VitkitError:
            raise  # the request's own mistake (a class out of range...): its 4xx
        except Exception as e:  # noqa: BLE001  the model failed: a 500 for this request, the server goes on
            log.error("vitkit serve: the model failed on a %s request: %s: %s", op, type(e).__name__,
                      " ".join(str(e).split()))
            raise ModelFailed(f"the model failed on this request ({type(e).__name__}); "
                              "the server log has the details") from None

    def waiting(self) -> dict[str, int]:
        return {op: b.waiting() for op, b in self.batchers.items()}

    def stats(self) -> dict[str, Any]:
        return {"batches": {op: dict(b.stats) for op, b in self.batchers.items()}, "runner": self.runner.stats()}
