"""The routes of `vitkit serve`: the page, /health, the schema, /v1/model and the five operations. Each
endpoint is a plain function that finds the server's parts in `request.app.state.serve` (a `ServeState`);
`add_routes` puts them on an app, the API ones behind the key check when there is one."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from .service import ModelService
from .uploads import RequestError, UploadReader
from .work import ModelWork

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
                                (500, "the model failed on this request (the server log has the details)"),
                                (503, "queue full, shutting down, or the model did not answer in time")]}
_PAGE_CSP = "default-src 'none'; img-src 'self' blob: data:; style-src 'unsafe-inline'; " \
            "script-src 'unsafe-inline'; connect-src 'self'; form-action 'none'"  # nothing from elsewhere


@dataclass
class ServeState:
    """What the endpoints of one app share: the model's operations, the runner they go through, the upload
    reader, the page, the limits /v1/model reports, and whether the API needs a key."""
    service: ModelService
    work: ModelWork
    uploads: UploadReader
    page: str
    limits: dict[str, Any]
    default_top_k: int
    keyed: bool


def _state(request: Request) -> ServeState:
    return request.app.state.serve


def _needs(state: ServeState, op: str) -> None:
    """Refuse an operation this server cannot do, before reading the upload."""
    if op == "search" and state.service.index is None:
        raise RequestError(404, "no index: start the server with --index INDEX to enable /v1/search")
    state.service.require(op)


async def _queued(state: ServeState, op: str, request: Request):
    """The upload of a batched operation, prepared, counted as on its way while it is read and decoded."""
    with state.work.on_its_way(op):
        return await state.uploads.read(request, prepare=True)


# ------------------------------------------------------------------------------------------- open to anyone
async def home(request: Request):
    return HTMLResponse(_state(request).page, headers={"Content-Security-Policy": _PAGE_CSP})


async def health(request: Request):
    state = _state(request)
    if state.keyed:  # only the status to a caller without a key: the model's name can be a path
        return {"status": "ok"}
    return {"status": "ok", "model": state.service.name, "waiting": state.work.waiting()}


# ------------------------------------------------------------------------------------------- the API
async def openapi_schema(request: Request):
    return JSONResponse(request.app.openapi())


async def model_info(request: Request):
    state = _state(request)
    return state.service.info() | {"server": state.limits | state.work.stats()}


async def predict(request: Request, top_k: int | None = Query(None, ge=1, le=1000, description="how many classes "
                                                              "(default: the server's --top-k)")):
    state = _state(request)
    _needs(state, "predict")
    image, image_name, x = await _queued(state, "predict", request)
    probs = await state.work.answer("predict", x)
    return state.service.describe_input(image, image_name) | {
        "model": state.service.name, "top": state.service.top(probs, top_k or state.default_top_k)}


async def detect(request: Request, score_threshold: float = Query(0.0, ge=0, le=1, description="keep boxes scoring "
                                                                    "at least this (the detector keeps those above "
                                                                    "its own task.score_thresh)")):
    state = _state(request)
    _needs(state, "detect")
    image, image_name, x = await _queued(state, "detect", request)
    size = (image.height, image.width)
    boxes = await state.work.answer("detect", (x, size))
    return state.service.describe_input(image, image_name) | {
        "model": state.service.name, "size": list(size), "boxes": [b for b in boxes if b["score"] >= score_threshold]}


async def explain(request: Request, method: Literal["rollout", "cls-attention", "grad-rollout"] = "rollout",
                  target: int | None = Query(None, ge=0, description="class for grad-rollout (default: predicted)")):
    state = _state(request)
    _needs(state, "explain")
    image, _, _ = await state.uploads.read(request)
    png, info = await state.work.answer("explain", (image, method, target))
    return Response(png, media_type="image/png", headers={"X-Vitkit-Explain": json.dumps(info)})


async def embed(request: Request, normalize: bool = Query(False, description="L2-normalise the vector")):
    state = _state(request)
    _needs(state, "embed")
    _, image_name, x = await _queued(state, "embed", request)
    feats = await state.work.answer("embed", x)  # [D]
    if normalize:
        feats = feats / feats.norm().clamp_min(1e-12)
    return {"image": image_name, "model": state.service.name, "dim": int(feats.numel()), "normalized": normalize,
            "embedding": feats.tolist()}


async def search(request: Request, k: int = Query(5, ge=1, le=100, description="how many neighbours")):
    state = _state(request)
    _needs(state, "search")
    _, image_name, x = await _queued(state, "search", request)
    hits = await state.work.answer("search", (x, k))
    return {"image": image_name, "model": state.service.name, "k": k, "hits": hits}


def add_routes(app: FastAPI, key_check=None) -> None:
    """The page and /health on `app` as they are; every other route behind `key_check` (a dependency that runs
    before the endpoint reads the body) when there is one."""
    app.add_api_route("/", home, methods=["GET"], response_class=HTMLResponse, include_in_schema=False)
    app.add_api_route("/health", health, methods=["GET"],
                      summary="liveness: the model is loaded and the server answers (no key needed)")
    api = APIRouter(dependencies=[] if key_check is None else [Depends(key_check)])
    api.add_api_route("/openapi.json", openapi_schema, methods=["GET"], include_in_schema=False)
    api.add_api_route("/v1/model", model_info, methods=["GET"],
                      summary="the model: name, family, classes, preprocessing, provenance; server limits")
    upload = {"methods": ["POST"], "responses": _ERRORS, "openapi_extra": {"requestBody": _IMAGE_BODY}}
    api.add_api_route("/v1/predict", predict, summary="top-k classes with probabilities", **upload)
    api.add_api_route("/v1/detect", detect, summary="boxes with labels and scores, in the image's pixels (a "
                      "detection run's checkpoint)", **upload)
    api.add_api_route("/v1/explain", explain, summary="attention heat map over the image (PNG)",
                      response_class=Response, **upload)
    api.add_api_route("/v1/embed", embed, summary="the image's feature vector", **upload)
    api.add_api_route("/v1/search", search, summary="the nearest images in the server's index",
                      **upload | {"responses": _ERRORS | {404: {"description": "the server has no index"}}})
    app.include_router(api)
