"""The FastAPI app behind `vitkit serve`: a model loaded once, its operations as JSON endpoints, and the
web page at `/`.

Request flow: the body is read into memory under the upload cap (413 above it, 408 when it arrives too
slowly), the image is decoded off the event loop with the pixel limit (as many at once as there are cores),
and the model work is queued on a `Batcher` worker thread (predict, embed and search are batched across
concurrent requests; explain runs one at a time; all four share one lock, so one model call runs at a time). Every refusal is a 4xx JSON `{"error": "..."}` with one line; a full queue or a model that does
not answer in time is a 503 with the same shape. Requests name no paths: nothing is read from or written
to the server's disk on their behalf (the page is read once, at start).

With `api_keys`, every route but the page and /health needs `Authorization: Bearer KEY` (401 otherwise),
checked before anything else about the request. /docs and /redoc are off: FastAPI's Swagger UI and ReDoc
pages load their scripts from a CDN (fastapi ships no copy), which a page on a private network must not
do; the schema is at /openapi.json.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import Iterable
from importlib import resources
from typing import Any, Literal

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ..data.images import decode_image
from ..errors import VitkitError
from .auth import BearerKeyCheck
from .batching import Batcher, BusyError
from .service import ModelService
from .uploads import RequestError, image_bytes, read_body

_IMAGE_BODY = {  # the OpenAPI description of the upload, since the body is parsed by hand (in memory)
    "required": True,
    "content": {
        "multipart/form-data": {"schema": {"type": "object", "required": ["file"],
                                           "properties": {"file": {"type": "string", "format": "binary"}}}},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "image/*": {"schema": {"type": "string", "format": "binary"}},
    },
}
_ERRORS = {status: {"description": text, "content": {"application/json": {"example": {"error": "one line"}}}}
           for status, text in [(400, "not an image, truncated, wrong field, or an operation the model lacks"),
                                (401, "no API key, or a wrong one (a server started with keys)"),
                                (408, "the upload arrived too slowly"), (413, "upload above the size limit"),
                                (415, "content type not accepted"), (422, "bad query parameter"),
                                (503, "queue full, shutting down, or the model did not answer in time")]}
_PAGE_CSP = "default-src 'none'; img-src 'self' blob: data:; style-src 'unsafe-inline'; " \
            "script-src 'unsafe-inline'; connect-src 'self'; form-action 'none'"  # nothing from elsewhere


def create_app(model: Any, *, name: str | None = None, backend: str = "torch", max_batch: int = 16,
               batch_timeout_ms: float = 5.0, max_upload_mb: float = 10.0, max_pixels: int | None = None,
               request_timeout_s: float = 30.0, upload_timeout_s: float = 30.0, max_queue: int = 1024,
               index: Any = None, index_path: str | None = None, default_top_k: int = 5,
               api_keys: Iterable[str] | None = None):
    """The app for `model`: a loaded model (vitkit or `OnnxRunner`) or anything `vitkit.api.load_model`
    accepts (a file, a run folder, `bundled:fashion-mnist`, a pretrained name). `index`: a
    `vitkit.retrieval.SearchIndex` (or a path to load one) to enable /v1/search. `max_batch=1` turns
    dynamic batching off. `api_keys`: the keys a caller may send as `Authorization: Bearer KEY` (None: no
    key needed; an empty set is refused, as is a key shorter than `auth.MIN_KEY_LENGTH`)."""
    key_check = None if api_keys is None else BearerKeyCheck(api_keys)  # refuses bad keys before the model loads
    service = _service(model, name, backend, index, index_path)
    upload_limit = int(max_upload_mb * 2**20)
    body_limit = upload_limit + 64 * 1024  # room for the multipart headers around the file
    # at most this many uploads are decoded at once: a 64 MP image is ~200 MB of pixels, so decoding is bounded
    # by the cores rather than by the thread pool's 40 threads
    decode_slots = anyio.CapacityLimiter(os.cpu_count() or 2)
    arriving = {"predict": 0, "embed": 0, "search": 0}  # requests received, not yet queued (the event loop's count)

    model_lock = threading.Lock()  # one model call at a time across all four batchers (see batching.py)

    def batcher(op: str, run) -> Batcher:
        return Batcher(run, max_batch, batch_timeout_ms, max_queue, f"vitkit-{op}", expecting=lambda: arriving[op],
                       run_lock=model_lock)

    predictor, embedder, searcher = (batcher("predict", service.predict_batch), batcher("embed", service.embed_batch),
                                     batcher("search", service.search_batch))
    explainer = Batcher(lambda jobs: [service.explain_png(*job) for job in jobs], 1, 0, max_queue, "vitkit-explain",
                        run_lock=model_lock)
    batchers = (predictor, embedder, explainer, searcher)
    page = resources.files("vitkit").joinpath("assets/serve.html").read_text(encoding="utf-8")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        for b in batchers:
            b.start()
        yield
        for b in batchers:  # uvicorn gets here after in-flight requests are answered (graceful SIGTERM)
            await run_in_threadpool(b.close)

    # docs_url/redoc_url off: their pages load Swagger UI / ReDoc from a CDN; openapi_url off: the schema is
    # served below, behind the key like the rest of the API
    app = FastAPI(title="vitkit serve", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None,
                  description=f"Vision Transformer inference for {service.name}: predict, explain, embed"
                  + (", search" if service.index is not None else "") + ". Errors are JSON {\"error\": \"...\"}.")
    app.state.service, app.state.batchers = service, batchers
    # every route on `api` checks the key first (a dependency runs before the endpoint reads the body)
    api = APIRouter(dependencies=[] if key_check is None else [Depends(key_check)])

    # --------------------------------------------------------------------------- errors: one JSON line
    def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"error": " ".join(str(message).split())}, status_code=status, headers=headers)

    @app.exception_handler(VitkitError)
    async def _vitkit_error(request, e: VitkitError):
        if isinstance(e, RequestError):
            return error(e.status, str(e))
        return error(503 if isinstance(e, BusyError) else 400, str(e))

    @app.exception_handler(HTTPException)
    async def _http_error(request, e: HTTPException):
        return error(e.status_code, e.detail, e.headers)  # keeps a 401's WWW-Authenticate

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, e: RequestValidationError):
        parts = []
        for err in e.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "body"))
            parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
        return error(422, "; ".join(parts) or "invalid request")

    @app.exception_handler(Exception)
    async def _bug(request, e: Exception):  # a bug, not a bad request: still JSON (the traceback goes to the log)
        return error(500, f"internal error ({type(e).__name__}); the server log has the details")

    # --------------------------------------------------------------------------- shared steps
    async def upload(request: Request, prepare: bool = False):
        """(decoded image, name, model input [C, H, W] when `prepare`) from the request, in memory, with every
        limit applied; decoding and preprocessing run off the event loop, in one hop."""
        try:
            body = await asyncio.wait_for(read_body(request.stream(), request.headers.get("content-length"),
                                                    body_limit), upload_timeout_s)
        except asyncio.TimeoutError:
            raise RequestError(408, f"the upload did not arrive within {upload_timeout_s:g} s") from None
        data, image_name = await image_bytes(request.headers.get("content-type", ""), request.headers, body)
        if len(data) > upload_limit:
            raise RequestError(413, f"{image_name}: {len(data) / 2**20:.1f} MB is above the {max_upload_mb:g} MB limit")

        def decode():
            image = decode_image(data, service.channels, max_pixels, image_name)
            return image, image_name, service.prepare(image) if prepare else None

        return await anyio.to_thread.run_sync(decode, limiter=decode_slots)

    async def queued(op: str, request: Request):
        """`upload` for a batched operation, counted as arriving while it is read and decoded."""
        arriving[op] += 1
        try:
            return await upload(request, prepare=True)
        finally:
            arriving[op] -= 1

    async def answer(batcher: Batcher, item):
        future = batcher.submit(item)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), request_timeout_s)
        except asyncio.TimeoutError:
            future.cancel()
            raise BusyError(f"the model did not answer within {request_timeout_s:g} s: try again") from None

    def needs(op: str) -> None:
        if op == "search" and service.index is None:
            raise RequestError(404, "no index: start the server with --index INDEX to enable /v1/search")
        service.require(op)  # refuse before reading the upload

    # --------------------------------------------------------------------------- routes
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def home():
        return HTMLResponse(page, headers={"Content-Security-Policy": _PAGE_CSP})

    @app.get("/health", summary="liveness: the model is loaded and the server answers (no key needed)")
    async def health():
        if key_check is not None:  # only the status to a caller without a key: the model's name can be a path
            return {"status": "ok"}
        return {"status": "ok", "model": service.name,
                "waiting": {b.name.removeprefix("vitkit-"): b.waiting() for b in batchers}}

    @api.get("/openapi.json", include_in_schema=False)
    async def openapi_schema():
        return JSONResponse(app.openapi())

    @api.get("/v1/model", summary="the model: name, family, classes, preprocessing, provenance; server limits")
    async def model_info():
        return service.info() | {"server": {
            "max_batch": max_batch, "batch_timeout_ms": batch_timeout_ms, "max_upload_mb": max_upload_mb,
            "max_pixels": max_pixels or _default_max_pixels(), "request_timeout_s": request_timeout_s,
            "default_top_k": default_top_k, "batches": {b.name.removeprefix("vitkit-"): dict(b.stats) for b in batchers},
        }}

    top_k_query = Query(None, ge=1, le=1000, description=f"how many classes (default {default_top_k})")

    @api.post("/v1/predict", summary="top-k classes with probabilities", responses=_ERRORS,
              openapi_extra={"requestBody": _IMAGE_BODY})
    async def predict(request: Request, top_k: int | None = top_k_query):
        image, image_name, x = await queued("predict", request)
        probs = await answer(predictor, x)
        return service.describe_input(image, image_name) | {"model": service.name,
                                                             "top": service.top(probs, top_k or default_top_k)}

    @api.post("/v1/explain", summary="attention heat map over the image (PNG)", responses=_ERRORS,
              openapi_extra={"requestBody": _IMAGE_BODY},
              response_class=Response)
    async def explain(request: Request, method: Literal["rollout", "cls-attention", "grad-rollout"] = "rollout",
                      target: int | None = Query(None, ge=0, description="class for grad-rollout (default: predicted)")):
        needs("explain")
        image, _, _ = await upload(request)
        png, info = await answer(explainer, (image, method, target))
        return Response(png, media_type="image/png", headers={"X-Vitkit-Explain": json.dumps(info)})

    @api.post("/v1/embed", summary="the image's feature vector", responses=_ERRORS,
              openapi_extra={"requestBody": _IMAGE_BODY})
    async def embed(request: Request, normalize: bool = Query(False, description="L2-normalise the vector")):
        needs("embed")
        _, image_name, x = await queued("embed", request)
        feats = await answer(embedder, x)
        if normalize:
            feats = feats / feats.norm().clamp_min(1e-12)
        return {"image": image_name, "model": service.name, "dim": int(feats.numel()), "normalized": normalize,
                "embedding": feats.tolist()}

    @api.post("/v1/search", summary="the nearest images in the server's index", responses=_ERRORS | {
        404: {"description": "the server has no index"}}, openapi_extra={"requestBody": _IMAGE_BODY})
    async def search(request: Request, k: int = Query(5, ge=1, le=100, description="how many neighbours")):
        needs("search")
        _, image_name, x = await queued("search", request)
        hits = await answer(searcher, (x, k))
        return {"image": image_name, "model": service.name, "k": k, "hits": hits}

    app.include_router(api)
    return app


def _service(model, name, backend, index, index_path) -> ModelService:
    if isinstance(model, (str, os.PathLike)):
        name = name or str(model)
        if backend == "onnx" or str(model).lower().endswith(".onnx"):
            from ..export.onnx import OnnxRunner

            model, backend = OnnxRunner(model), "onnx"
        else:
            from ..api import load_model

            model = load_model(model)
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

