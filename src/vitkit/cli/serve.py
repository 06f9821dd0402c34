"""`vitkit serve CKPT`: the model behind an HTTP API and a web page (FastAPI on uvicorn); see docs/serve.md."""
from __future__ import annotations

import argparse
import os
import sys

from .common import non_negative_float, positive_int
from .export import add_max_tokens, add_merge, with_patch_size


def _positive(text: str) -> float:
    v = non_negative_float(text)
    if v == 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return v


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over HTTP: JSON API (predict, explain, embed, search) and a web page",
                       epilog="API keys: with --api-key, VITKIT_API_KEY or --api-key-file, every route but the page (/) "
                       "and /health needs the header 'Authorization: Bearer KEY' (401 otherwise); the page asks for "
                       "the key once. API docs: the OpenAPI schema at /openapi.json; /docs and /redoc are off, "
                       "because FastAPI's Swagger UI and ReDoc load their scripts from a CDN.")
    p.add_argument("checkpoint", help="any checkpoint vitkit can load (file, run folder, bundled:NAME, pretrained "
                   "name), or an .onnx file with --backend onnx")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only); "
                   "any other than loopback (127.0.0.0/8, ::1, localhost) needs an API key or --insecure")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--backend", choices=["torch", "onnx"], default="torch",
                   help="onnx: CHECKPOINT is an .onnx file from `vitkit export` (predict only)")
    p.add_argument("--max-batch", type=positive_int, default=16,
                   help="largest batch of concurrent requests run as one model call (1: no batching)")
    p.add_argument("--batch-timeout-ms", type=non_negative_float, default=5.0,
                   help="how long the first request of a batch waits for others (default 5)")
    p.add_argument("--max-upload-mb", type=_positive, default=10.0, help="largest upload accepted (413 above)")
    p.add_argument("--max-pixels", type=positive_int,
                   help="largest declared image size in pixels (default: vitkit.data.images.MAX_PIXELS, 64 MP)")
    p.add_argument("--timeout-s", type=_positive, default=30.0,
                   help="longest wait for the model (503 after) and for an upload to arrive (408 after)")
    p.add_argument("--threads", type=positive_int, help="threads the model computes with: torch's intra-op "
                   "threads, set once on the server's one model thread (ONNX Runtime's with --backend onnx); "
                   "default: torch's count, the cores. The server's other threads: the event loop and, while "
                   "uploads are decoded, up to one per core")
    p.add_argument("--patch-size", type=positive_int, metavar="P", help="serve at P-pixel patches: the checkpoint's "
                   "patch kernel resampled (FlexiViT's pseudo-inverse resize) and its position grid following; "
                   "smaller patches are more tokens, slower and often more accurate (PyTorch backend, ViT models)")
    add_merge(p)
    add_max_tokens(p)
    p.add_argument("--top-k", type=positive_int, default=5, help="classes returned when a request does not say")
    p.add_argument("--index", metavar="INDEX", help="a search index from `vitkit index` to enable /v1/search")
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on the API (default: "
                   "$VITKIT_API_KEY). A command line is visible to other users (ps): prefer the variable or a file")
    p.add_argument("--api-key-file", metavar="PATH", help="accept the keys in this file too: one a line, blank "
                   "lines and # comments ignored; it must not be world-readable (chmod 600)")
    p.add_argument("--insecure", action="store_true", help="allow a --host other than loopback without an API key "
                   "(anyone who reaches the address can use the API)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import ConfigError

    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise ConfigError("vitkit serve needs FastAPI and uvicorn: pip install 'vitkit[serve]'") from None
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {args.port}")
    from ..serve import create_app, is_loopback
    from .common import load_backend

    api_keys = _api_keys(args)  # like the port, refused before the (slow) model load
    if api_keys is None and not is_loopback(args.host):
        if not args.insecure:
            raise ConfigError(f"--host {args.host} lets other machines reach the server, and it has no API key: "
                              "set VITKIT_API_KEY (or --api-key / --api-key-file), or pass --insecure to serve "
                              "without one")
        print(f"vitkit serve: warning: no API key on --host {args.host}: anyone who can reach this address can "
              "use the API (--insecure)", file=sys.stderr, flush=True)
    _check_port(args.host, args.port)  # before the (slow) model load, and instead of uvicorn's log line

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)  # before the load: an ONNX session takes torch's count when it is made
    from ..inference import load_detector

    # loaded once, before the port opens; a task=detect run's checkpoint is its detector (/v1/detect)
    model = (load_detector(args.checkpoint) if args.backend == "torch" else None) or \
        load_backend(args.checkpoint, args.backend)
    with_patch_size(model, args)
    backend = "torch" if hasattr(model, "state_dict") else "onnx"
    app = create_app(model, name=str(args.checkpoint), backend=backend, max_batch=args.max_batch,
                     batch_timeout_ms=args.batch_timeout_ms, max_upload_mb=args.max_upload_mb,
                     max_pixels=args.max_pixels, request_timeout_s=args.timeout_s, upload_timeout_s=args.timeout_s,
                     index=args.index, default_top_k=args.top_k, api_keys=api_keys, torch_threads=args.threads)
    keys = "no API key" if api_keys is None else f"{len(api_keys)} API key{'s' if len(api_keys) > 1 else ''}"
    print(f"vitkit serve: {args.checkpoint} at http://{args.host}:{args.port}/  ({keys}; API schema: /openapi.json; "
          "Ctrl-C or SIGTERM stops it after the requests in flight)", flush=True)
    # uvicorn's SIGTERM/SIGINT handling stops accepting, lets in-flight requests finish (up to the grace
    # period), then runs the app's shutdown, which drains the batch queues
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=args.timeout_s)
    return 0


def _api_keys(args) -> tuple[str, ...] | None:
    """The keys the server accepts: --api-key (else $VITKIT_API_KEY, unless empty) and those of --api-key-file;
    None when there are none (no key needed)."""
    from ..serve import KEY_ENV, check_key, read_key_file

    keys: list[str] = []
    if args.api_key is not None:
        keys.append(check_key(args.api_key, "--api-key"))
    elif os.environ.get(KEY_ENV):
        keys.append(check_key(os.environ[KEY_ENV], KEY_ENV))
    if args.api_key_file is not None:
        keys += read_key_file(args.api_key_file)
    return tuple(dict.fromkeys(keys)) or None


def _check_port(host: str, port: int) -> None:
    """Refuse in one line a port this process cannot listen on (in use, privileged, unknown host)."""
    import socket

    from ..errors import ConfigError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(addr)
        except OSError as e:
            raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror}): choose another --port") from None
