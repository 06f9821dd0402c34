"""The FastAPI app behind `vitkit serve`: a model loaded once, its operations as JSON endpoints, and the
web page at `/`. `create_app` puts the pieces together: the model's operations (`service`), the one thread
that runs the model and the batching in front of it (`work`, `batching`), the upload reader (`uploads`),
the routes (`endpoints`), the key check (`auth`), and here the lifespan and the errors.

Request flow: the body is read into memory under the upload cap (413 above it, 408 when it arrives too
slowly), the image is decoded off the event loop with the pixel limit (as many at once as there are cores),
and the model work is queued for the one model runner thread (predict, embed, search and detect are batched across
concurrent requests; explain runs one at a time; one model call runs at a time). Every refusal is a 4xx
JSON `{"error": "..."}` with one line; a full queue or a model that does not answer in time is a 503, a
model call that fails a 500, with the same shape. Requests name no paths: nothing is read from or written
to the server's disk on their behalf (the page is read once, at start).

Threads: the event loop (one), the model runner (one) and torch's `torch_threads` intra-op threads that
it computes with (set once, on the runner; default torch's own count, the cores), and up to one decoding
thread per core while uploads are being decoded. No other thread runs the model.

With `api_keys`, every route but the page and /health needs `Authorization: Bearer KEY` (401 otherwise),
checked before anything else about the request. /docs and /redoc are off: FastAPI's Swagger UI and ReDoc
pages load their scripts from a CDN (fastapi ships no copy), which a page on a private network must not
do; the schema is at /openapi.json.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ..errors import VitkitError
from .auth import BearerKeyCheck
from .batching import BusyError
from .endpoints import ServeState, add_routes
from .service import ModelService
from .uploads import RequestError, UploadReader
from .work import ModelFailed, ModelWork


def create_app(model: Any, *, name: str | None = None, backend: str = "torch", max_batch: int = 16,
               batch_timeout_ms: float = 5.0, max_upload_mb: float = 10.0, max_pixels: int | None = None,
               request_timeout_s: float = 30.0, upload_timeout_s: float = 30.0, max_queue: int = 1024,
               index: Any = None, index_path: str | None = None, default_top_k: int = 5,
               api_keys: Iterable[str] | None = None, torch_threads: int | None = None):
    """The app for `model`: a loaded model (vitkit or `OnnxRunner`) or anything `vitkit.api.load_model`
    accepts (a file, a run folder, `bundled:fashion-mnist`, a pretrained name). `index`: a
    `vitkit.retrieval.SearchIndex` (or a path to load one) to enable /v1/search. `max_batch=1` turns
    dynamic batching off. `api_keys`: the keys a caller may send as `Authorization: Bearer KEY` (None: no
    key needed; an empty set is refused, as is a key shorter than `auth.MIN_KEY_LENGTH`). `torch_threads`:
    the torch threads the model runner computes with (None: torch's current count)."""
    key_check = None if api_keys is None else BearerKeyCheck(api_keys)  # refuses bad keys before the model loads
    service = _service(model, name, backend, index, index_path)
    if torch_threads is None:
        import torch

        torch_threads = torch.get_num_threads()
    work = ModelWork(service, max_batch=max_batch, batch_timeout_ms=batch_timeout_ms, max_queue=max_queue,
                     request_timeout_s=request_timeout_s, torch_threads=torch_threads)
    limits = {"max_batch": max_batch, "batch_timeout_ms": batch_timeout_ms, "max_upload_mb": max_upload_mb,
              "max_pixels": max_pixels or _default_max_pixels(), "request_timeout_s": request_timeout_s,
              "default_top_k": default_top_k}
    state = ServeState(service, work, UploadReader(service, max_upload_mb, max_pixels, upload_timeout_s),
                       page=resources.files("vitkit").joinpath("assets/serve.html").read_text(encoding="utf-8"),
                       limits=limits, default_top_k=default_top_k, keyed=key_check is not None)
    # docs_url/redoc_url off: their pages load Swagger UI / ReDoc from a CDN; openapi_url off: the schema is
    # served by a route, behind the key like the rest of the API
    app = FastAPI(title="vitkit serve", version=_version(), lifespan=_lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None,
                  description=f"Vision Transformer inference for {service.name}: "
                  + ("detect" if service.detects else "predict, explain, embed")
                  + (", search" if service.index is not None else "") + ". Errors are JSON {\"error\": \"...\"}.")
    app.state.serve, app.state.service = state, service
    _add_error_handlers(app)
    add_routes(app, key_check)
    return app


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI):
    work: ModelWork = app.state.serve.work
    work.start()
    yield
    # uvicorn gets here after in-flight requests are answered (graceful SIGTERM); whatever is still queued
    # gets one request timeout to run, then a refusal
    await run_in_threadpool(work.close, work.request_timeout_s)


# ------------------------------------------------------------------------------------------- errors: one JSON line
def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status_code=status, headers=headers)


async def _vitkit_error(request, e: VitkitError):
    if isinstance(e, RequestError):
        return _error(e.status, str(e))
    if isinstance(e, ModelFailed):
        return _error(500, str(e))
    return _error(503 if isinstance(e, BusyError) else 400, str(e))


async def _http_error(request, e: HTTPException):
    return _error(e.status_code, e.detail, e.headers)  # keeps a 401's WWW-Authenticate


async def _validation_error(request, e: RequestValidationError):
    parts = []
    for err in e.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "body"))
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return _error(422, "; ".join(parts) or "invalid request")


async def _bug(request, e: Exception):  # a bug, not a bad request: still JSON (the traceback goes to the log)
    return _error(500, f"internal error ({type(e).__name__}); the server log has the details")


def _add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(VitkitError, _vitkit_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _bug)


# ------------------------------------------------------------------------------------------- the model
def _service(model, name, backend, index, index_path) -> ModelService:
    if isinstance(model, (str, os.PathLike)):
        name = name or str(model)
        if backend == "onnx" or str(model).lower().endswith(".onnx"):
            from ..export.onnx import OnnxRunner

            model, backend = OnnxRunner(model), "onnx"
        else:
            from ..api import load_model
            from ..inference import load_detector

            model = load_detector(model) or load_model(model)  # a task=detect run's folder: its detector
    if isinstance(index, (str, os.PathLike)):
        from ..retrieval import SearchIndex  # lazily: only a server started with an index needs faiss

        index_path = index_path or str(index)
        index = SearchIndex.load(index)
    service = ModelService(model, name or type(model).__name__, backend, index, index_path)
    if index is not None:
        service.check_index()
    return service


def _default_max_pixels() -> int:
    from ..data import images

    return images.MAX_PIXELS


def _version() -> str:
    from .._version import __version__

    return __version__
