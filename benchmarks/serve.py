"""Load test of `vitkit serve` on loopback: requests/s and p50/p99 latency at 1, 8 and 32 concurrent clients, with
dynamic batching (--max-batch 32) and without (--max-batch 1), against the same model's offline batch throughput.

Each configuration starts its own `vitkit serve` process (the load generator stays out of the server's GIL),
sends a bounded number of POST /v1/predict requests of a real photo (PNG at the model's input size), and
checks that every request got exactly one 200 answer. Offline throughput is the model alone on batches of
32 already-preprocessed inputs (no decoding, no HTTP): the ceiling the server is compared with.

    python benchmarks/serve.py            # bundled:fashion-mnist and ViT-S/16 (random weights); run it idle
    python benchmarks/serve.py --quick    # smoke run: bundled model, 1 and 8 clients, few requests

Writes benchmarks/results/serve.{md,json} (serve-quick.* for --quick).
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import vitkit
from vitkit._files import atomic_write_text
from vitkit.data.images import decode_image
from vitkit.data.transforms import eval_transform

RESULTS = Path(__file__).resolve().parent / "results"


def photo_png(size: int, channels: int) -> bytes:
    """skimage's astronaut at the model's input size, as the bytes a client uploads."""
    from skimage import data

    img = Image.fromarray(data.astronaut()).resize((size, size), Image.BILINEAR)
    buf = io.BytesIO()
    (img.convert("L") if channels == 1 else img).save(buf, format="PNG")
    return buf.getvalue()


def offline_throughput(model, image_bytes: bytes, batch: int = 32, seconds: float = 3.0) -> float:
    """Images/s of the model alone on batches of `batch` preprocessed copies of the image."""
    x = eval_transform(model.preprocess)(decode_image(image_bytes, model.preprocess.input_size[0]))  # [C, H, W]
    xb = x[None].expand(batch, *x.shape).contiguous()  # [B, C, H, W]
    model.eval()
    with torch.no_grad():
        model(xb)  # warm-up
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds or n < 2:
            model(xb)
            n += 1
        return n * batch / (time.perf_counter() - t0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`vitkit serve CKPT` in its own process on a free loopback port."""

    def __init__(self, checkpoint: str, max_batch: int, timeout_ms: float):
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vitkit", "serve", checkpoint, "--port", str(self.port), "--max-batch",
             str(max_batch), "--batch-timeout-ms", str(timeout_ms), "--timeout-s", "120"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {self.proc.stderr.read()[-2000:]}")
            time.sleep(0.1)

    def stats(self) -> dict:
        import httpx

        return httpx.get(self.url + "/v1/model").json()["server"]["batches"]["predict"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def load(url: str, body: bytes, clients: int, requests: int) -> dict:
    """`clients` concurrent loops sharing `requests` POSTs; every request's status and latency."""
    import httpx

    latencies: list[float] = []
    statuses: list[int] = []
    todo = iter(range(requests))

    async def client_loop(http: httpx.AsyncClient) -> None:
        for _ in todo:
            t0 = time.perf_counter()
            try:
                r = await http.post(url + "/v1/predict", content=body, headers={"content-type": "image/png"})
                statuses.append(r.status_code)
                r.json()["top"]
            except (httpx.HTTPError, KeyError, ValueError):
                statuses.append(-1)
            latencies.append(time.perf_counter() - t0)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=120) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop(http) for _ in range(clients)))
        wall = time.perf_counter() - t0
    lat = np.array(latencies) * 1000
    return {"clients": clients, "requests": requests, "answered": len(statuses), "ok": statuses.count(200),
            "rps": requests / wall, "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}


def requests_for(clients: int, per_request_s: float, quick: bool) -> int:
    """Enough requests for a steady measurement, bounded in time (about 8 s at the offline rate)."""
    if quick:
        return 4 * clients + 8
    return int(max(4 * clients, min(400, 8.0 / per_request_s)))


def run(quick: bool, models: list[str], clients: list[int], timeout_ms: float) -> dict:
    rows, offline = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            if name.startswith("bundled:"):
                ckpt, model = name, vitkit.load_model(name)
            else:  # random weights: throughput does not depend on them
                model = vitkit.create_model(name, num_classes=1000)
                ckpt = str(Path(tmp) / f"{name}.safetensors")
                vitkit.save_model(model, ckpt)
            c, h = model.preprocess.input_size[:2]
            body = photo_png(h, c)
            offline[name] = offline_throughput(model, body, seconds=1.0 if quick else 3.0)
            print(f"{name}: offline {offline[name]:.1f} images/s (batch 32)", flush=True)
            for max_batch in (32, 1):
                server = Server(ckpt, max_batch, timeout_ms)
                try:
                    asyncio.run(load(server.url, body, 2, 4))  # warm-up
                    for n in clients:
                        res = asyncio.run(load(server.url, body, n, requests_for(n, 1 / offline[name], quick)))
                        res |= {"model": name, "batching": max_batch > 1, "max_batch": max_batch,
                                "fraction_of_offline": res["rps"] / offline[name]}
                        rows.append(res)
                        print(f"  max_batch {max_batch:2d}, {n:2d} clients: {res['rps']:7.1f} req/s  p50 "
                              f"{res['p50_ms']:7.1f} ms  p99 {res['p99_ms']:7.1f} ms  "
                              f"{100 * res['fraction_of_offline']:5.1f}% of offline  "
                              f"({res['ok']}/{res['requests']} ok)", flush=True)
                    batches = server.stats()
                    for r in rows:
                        if r["model"] == name and r["max_batch"] == max_batch:
                            r["server_batches"] = batches
                finally:
                    server.stop()
    lost = [r for r in rows if r["answered"] != r["requests"] or r["ok"] != r["requests"]]
    return {"quick": quick, "offline_images_per_s": offline, "rows": rows, "lost_or_failed": len(lost),
            "batch_timeout_ms": timeout_ms, "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "machine": platform.processor() or platform.machine(), "torch": torch.__version__}


def markdown(res: dict) -> str:
    lines = [f"Loopback load test of `vitkit serve` (POST /v1/predict, PNG at the model's input size), {res['cpus']} "
             f"CPUs, torch {res['torch']} with {res['torch_threads']} threads; batching = `--max-batch 32 "
             f"--batch-timeout-ms {res['batch_timeout_ms']:g}`, no batching = `--max-batch 1`. Offline = the model "
             "alone on batches of 32 preprocessed inputs.", "",
             "| model | batching | clients | requests | req/s | p50 ms | p99 ms | % of offline |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['model']} | {'yes' if r['batching'] else 'no'} | {r['clients']} | {r['requests']} | "
                     f"{r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {100 * r['fraction_of_offline']:.0f}% |")
    lines += ["", "Offline batch-32 throughput: " + ", ".join(f"{k} {v:.1f} images/s"
                                                           for k, v in res["offline_images_per_s"].items()),
              f"Requests without exactly one 200 answer: {res['lost_or_failed']} configurations."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: bundled model, 1 and 8 clients, few requests")
    p.add_argument("--models", nargs="+", help="default: bundled:fashion-mnist vit_small_patch16_224")
    p.add_argument("--clients", nargs="+", type=int, help="default: 1 8 32")
    p.add_argument("--batch-timeout-ms", type=float, default=5.0)
    args = p.parse_args()
    models = args.models or (["bundled:fashion-mnist"] if args.quick else
                             ["bundled:fashion-mnist", "vit_small_patch16_224"])
    clients = args.clients or ([1, 8] if args.quick else [1, 8, 32])
    res = run(args.quick, models, clients, args.batch_timeout_ms)
    RESULTS.mkdir(exist_ok=True)
    stem = "serve-quick" if args.quick else "serve"
    atomic_write_text(RESULTS / f"{stem}.json", json.dumps(res, indent=1) + "\n")
    atomic_write_text(RESULTS / f"{stem}.md", markdown(res))
    print(markdown(res))
    if res["lost_or_failed"]:
        sys.exit(f"{res['lost_or_failed']} configurations lost or failed requests")


if __name__ == "__main__":
    main()
