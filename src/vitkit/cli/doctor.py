"""`vitkit doctor`: what this machine can do (CPU instruction sets, cores, CUDA) and which fast paths vitkit
takes on it, with the rule and the measurement behind each (vitkit.hardware)."""
from __future__ import annotations

from typing import Any

from .common import add_json, emit, print_table


def register(sub) -> None:
    p = sub.add_parser("doctor", help="detected hardware and the fast paths vitkit takes on it, with reasons")
    p.add_argument("--measure", action="store_true", help="first time the paths no rule covers on this machine "
                   "(a few seconds; run it on an idle machine) and cache the result (vitkit.hardware)")
    add_json(p)
    p.set_defaults(func=run)


def report() -> dict[str, Any]:
    """{'capabilities': ..., 'threads': torch threads, 'measured': cached micro-benchmark or None,
    'decisions': {device: ...}} for this machine."""
    import torch

    from ..hardware import cached_measurement, detect, this_machine

    caps = detect()
    devices = ["cpu", "cuda"] if caps.cuda else ["cpu"]
    return {"capabilities": caps.to_dict(), "threads": torch.get_num_threads(), "measured": cached_measurement(caps),
            "decisions": {d: this_machine(d).to_dict() for d in devices}}


def render(r: dict[str, Any]) -> None:
    c = r["capabilities"]
    gpu = f"{c['gpu']} (compute capability {'.'.join(map(str, c['cuda_capability']))})" if c["cuda"] else "none"
    flags = [k for k in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx") if c[k]]
    print_table("this machine", ["what", "detected"], [
        ("CPU", f"{c['cpu']} ({c['vendor'] or 'vendor unknown'})"),
        ("kind", c["kind"]),
        ("instruction sets", ", ".join(flags) or "none of avx2, avx512f, avx512_bf16, avx512_vnni, amx"),
        *([("capped by", c["capped_by"] + ": the flags above are what the kernels may use")] if c.get("capped_by")
          else []),
        ("native bf16", "yes" if c["native_bf16"] else "no (emulated: slow)"),
        ("torch kernels", f"{c['torch_isa']}, oneDNN {'yes' if c['onednn'] else 'no'}"),
        ("cores / torch threads", f"{c['cores']} / {r['threads']}"),
        ("GPU", gpu),
        ("torch", c["torch"]),
        ("measured here", "none (`vitkit doctor --measure`)" if not r["measured"] else
         f"{r['measured']['date']}: " + ", ".join(f"{k} {v:.2f}x" if v is not None else f"{k} not timed"
                                                  for k, v in r["measured"]["ratios"].items())),
    ], justify=("left", "left"))
    for device, d in r["decisions"].items():
        rows = [(name, "on" if p["on"] else "off", p["why"]) for name, p in d["paths"].items()]
        print_table(f"fast paths on {device} (default precision {d['precision']})", ["path", "", "why"], rows,
                    justify=("left", "left", "left"))


def run(args) -> int:
    if args.measure:
        from ..hardware import cache_file, measure_and_cache

        measure_and_cache()
        if not args.json:
            print(f"measured; cached in {cache_file()}")
    emit(args, report(), render)
    return 0
