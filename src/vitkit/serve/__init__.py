"""`vitkit serve`: a trained model behind an HTTP API and a web page (FastAPI + uvicorn).

`create_app(model_or_path, ...)` builds the app; `vitkit serve CKPT` runs it with uvicorn. The parts:
`uploads` (request bodies to images, in memory, with limits), `batching` (dynamic batching, and the one
model runner thread that makes every model call), `work` (the server's runner and its batchers),
`service` (the model operations without HTTP), `auth` (API keys, the key file, which hosts are loopback),
`endpoints` (the routes) and `app` (putting them together, the lifespan, the errors)."""
from __future__ import annotations

from .app import create_app
from .auth import KEY_ENV, check_key, check_keys, is_loopback, read_key_file
from .batching import Batcher, BusyError, ModelRunner

__all__ = ["KEY_ENV", "Batcher", "BusyError", "ModelRunner", "check_key", "check_keys", "create_app", "is_loopback",
           "read_key_file"]
