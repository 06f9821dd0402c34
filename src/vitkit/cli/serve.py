"""`vitkit serve CKPT`: the model behind an HTTP API and a web page (FastAPI on uvicorn); see docs/serve.md."""
from __future__ import annotations

import argparse

from .common import non_negative_float, positive_int


def _positive(text: str) -> float:
    v = non_negative_float(text)
    if v == 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return v


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over HTTP: JSON API (predict, explain, embed, search) and a web page")
    p.add_argument("checkpoint", help="any checkpoint vitkit can load (file, run folder, bundled:NAME, pretrained "
                   "name), or an .onnx file with --backend onnx")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
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
    p.add_argument("--top-k", type=positive_int, default=5, help="classes returned when a request does not say")
    p.add_argument("--index", metavar="INDEX", help="a search index from `vitkit index` to enable /v1/search")
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
    from ..serve import create_app
    from .common import load_backend

    _check_port(args.host, args.port)  # before the (slow) model load, and instead of uvicorn's log line

    model = load_backend(args.checkpoint, args.backend)  # loaded once, before the port opens
    backend = "torch" if hasattr(model, "state_dict") else "onnx"
    app = create_app(model, name=str(args.checkpoint), backend=backend, max_batch=args.max_batch,
                     batch_timeout_ms=args.batch_timeout_ms, max_upload_mb=args.max_upload_mb,
                     max_pixels=args.max_pixels, request_timeout_s=args.timeout_s, upload_timeout_s=args.timeout_s,
                     index=args.index, default_top_k=args.top_k)
    print(f"vitkit serve: {args.checkpoint} at http://{args.host}:{args.port}/  (API docs: /docs; Ctrl-C or "
          "SIGTERM stops it after the requests in flight)", flush=True)
    # uvicorn's SIGTERM/SIGINT handling stops accepting, lets in-flight requests finish (up to the grace
    # period), then runs the app's shutdown, which drains the batch queues
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=args.timeout_s)
    return 0


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
