"""What this machine can do, and which fast paths vitkit takes on it.

`detect()` reads the CPU's instruction sets (AVX2, AVX-512, AVX-512 BF16/VNNI, AMX), its cores, and CUDA with
its compute capability. `decide(caps)` turns that into one decision per fast path, each a documented rule of
the capabilities with the measurement it rests on (the table below). A fast path is on only for the kind of
machine where it was measured to win; on a kind nobody measured, vitkit takes the path timm takes, so it is
never the one that loses. `vitkit doctor` prints both, with the reasons.

Measured machine kinds (2 cores each, torch 2.14.1, vitkit against timm side by side in one process):

| kind | example | fp32 Linear | bf16 | numbers |
|---|---|---|---|---|
| AVX-512 + native bf16 | AMD EPYC Zen 4 | oneDNN 1.4-1.8x MKL | native | BENCHMARKS.md (2026-11-29) |
| AVX2 only | AMD EPYC Zen 3 | oneDNN lost (0.88-0.89x) | emulated: 3-7x slower than fp32 | issue 10's table |

Rules (a decision's `why` says which one applied):
  bf16              bf16 for inference that asks for the fast precision only with native bf16: AVX512_BF16 or
                    AMX on a CPU, compute capability >= 8.0 on CUDA.
  bf16_training     bf16 autocast for training by default: the same rule as bf16 (Zen 4: the fashion-mnist
                    model's training step 1841 img/s bf16 vs 878 fp32; Zen 3: the recipe's first 40 steps
                    < 43 img/s bf16 vs 306 fp32). Measured apart from inference because they disagree: on a
                    2-core Xeon with AMX, bf16 linears ran 2.8x fp32 while the fashion-mnist training step ran
                    at half the fp32 speed in bf16 autocast (216 vs 436 img/s, `vitkit bench`).
  onednn_linear     fp32 nn.Linear through oneDNN instead of MKL sgemm: on AMD CPUs with AVX-512, where MKL
                    takes its AVX2 path (Zen 4: ViT-Ti/S inference 1.4-1.8x, 32px training 1.42x timm). Off
                    on AVX2-only CPUs (Zen 3: 0.88x / 0.89x timm in fp32, where this linear is the main
                    difference from timm's path) and on kinds not measured (e.g. Intel with AVX-512, where
                    MKL uses AVX-512 itself).
  matmul_attention  bf16 attention as two matmuls + softmax instead of SDPA's flash kernel (CPU, <= 1024
                    tokens): with native bf16 only (Zen 4: 2-5x faster); Zen 3 ran bf16 autocast at 0.64x
                    timm, which uses SDPA.
  matmul_attention_training
                    the same for training (forward and backward, under grad): the same rule; measured apart
                    because SDPA's CPU flash backward in bf16 is the slow part there (a 2-core Xeon with AMX:
                    113 ms a call vs 9 ms in fp32 for the fashion-mnist model), while its forward is fine
                    (the matmul form measured 0.80x it for inference on the same machine).
  native_encoder    torch's fused encoder-layer kernel for bf16 inference: with native bf16 only (Zen 4:
                    1.07x); not measured elsewhere.
  packed_linear     inference linears on weights packed once per batch shape for their kernel (MKL's packed
                    sgemm in fp32, as inductor's freezing does; oneDNN's blocked layout in bf16, with an MLP's
                    GELU in fc1's matmul where the kernel is oneDNN's): with AMX (a
                    2-core Xeon: ViT-S/16 inference 1.04-1.13x timm, fp32 and bf16, batch 1 and 8); not measured
                    elsewhere.
  widened_bf16      bf16 and bf16-autocast inference linears where oneDNN has no bf16 matmul (bf16 emulated):
                    operands rounded to bf16 and widened to fp32 (exact), multiplied on packed fp32 weights, the
                    output rounded to bf16 (layers.mlp.Linear.packed_plan). Decided apart from packed_linear:
                    under the AVX2 cap a Zen 4's MKL packed sgemm lost in fp32 (0.94x) while this path ran the
                    capped Xeon's bf16 rows 4.05-5.68x timm. Decided only by measuring (off by rule).
  widened_bf16_training
                    bf16 autocast linears under grad, where oneDNN has no bf16 matmul (bf16 emulated): operands
                    rounded to bf16 and widened to fp32 (exact), multiplied in fp32 forward and backward
                    (onednn.WidenedLinear). Decided only by measuring (off by rule): the AVX2 stand-in measured
                    a linear's step 10.5x and the bench's bf16-autocast training steps 12.8-17.6x timm's.
  channels_last_training
                    convolution weights in channels-last (NHWC) order for training, so oneDNN runs its NHWC
                    kernels without reordering each call: decided on the model at hand, by timing its own
                    training step in both orders (training/memory_format.py; cached per machine and model), since
                    a conv block alone misleads: on a 2-core Zen 4 a bf16 Conv-BN-ReLU timed alone ran 0.57-0.78x
                    in channels-last while whole training steps ran 1.13x (fashion-mnist-conv's conv-stem ViT)
                    and 1.20x (ResNet-18 at 28 px). Off where measuring is off, as timm.
  onnx_runtime      ONNX Runtime (fp32) instead of eager for inference: not chosen on Zen 4, where bf16 eager
                    beats it (ViT-Ti batch 1: 124 vs 59 img/s; ViT-S batch 8: 63 vs 31); not measured on
                    other kinds (`vitkit bench --precisions fp32 --backends eager onnx` measures it).

Decided by measurement (issue 22: two Zen 4 machines with the same flags differed 2x in oneDNN throughput,
so no rule of the flags can hold everywhere): the first command that needs a decision times each measurable
path against the path timm takes (`measure`: fp32 linear oneDNN vs F.linear, bf16 vs fp32 linear, one block's
linears on packed weights vs F.linear at batch 1 and 8 in fp32 and bf16 (their geometric mean, counted only where
none is slower; where oneDNN has no bf16 matmul, bf16 widened to fp32 on them at batch 1, apart), bf16 attention
matmul + softmax vs SDPA, bf16 encoder layer fused kernel vs module path, and on a training step of a pre-norm
ViT block: bf16 attention under grad matmul + softmax vs SDPA, the block in bf16 autocast vs fp32, and the fp32
linear with its backward, oneDNN vs F.linear; ViT-S shapes (training: also the fashion-mnist model's), a few
seconds, said in one line) and caches the ratios per machine fingerprint
(`machine_key`: CPU model, flags, cores, threads, torch / oneDNN / ONNX Runtime / OpenVINO versions) in
$VITKIT_CACHE/fast-paths.json (default ~/.cache/vitkit); later processes read it, `vitkit doctor --measure`
refreshes it ($VITKIT_MEASURE_ROUNDS: rounds per path, default 15). A path is on where it
measured at least MEASURED_WIN times faster than timm's path, else off. The rules above are the prior: they
decide where measuring is off ($VITKIT_MEASURE=0, as the tests set) and for what is not measured (CUDA,
ONNX Runtime). A cache that cannot be read or written means measuring again, kept in memory, with a note.

The flags are what this process's kernels may use, not only what the CPU has: ATEN_CPU_CAPABILITY and
ONEDNN_MAX_CPU_ISA lower them (`apply_isa_caps`), so a Zen 4 run with both at AVX2 decides as an AVX2 machine
(docs/speed.md measures that stand-in against timm).

`VITKIT_FAST_PATHS="onednn_linear=off,bf16=on"` overrides decisions for a process (to measure one against
another, or to work around a rule that is wrong for a machine).
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import onednn
from .errors import ConfigError
from .timing import paired_ratio, paired_times

DECISIONS = ("bf16", "bf16_training", "onednn_linear", "onednn_linear_training", "matmul_attention",
             "matmul_attention_training", "native_encoder", "packed_linear", "widened_bf16",
             "widened_bf16_training", "channels_last_training", "onnx_runtime")
# what `measure` times (CPU)
MEASURABLE = ("bf16", "bf16_training", "onednn_linear", "onednn_linear_training", "matmul_attention",
              "matmul_attention_training", "native_encoder", "packed_linear", "widened_bf16",
              "widened_bf16_training")
# timed only where this torch build has oneDNN
NEEDS_ONEDNN = ("onednn_linear", "onednn_linear_training", "packed_linear", "widened_bf16", "widened_bf16_training")
MEASURED_WIN = 1.03  # a path is taken only where it measured at least this much faster than timm's path
EMULATED_BF16 = 0.5  # bf16 linears under this ratio to fp32: emulated bf16, whose other paths are not timed
ENV_OVERRIDE = "VITKIT_FAST_PATHS"
ENV_MEASURE = "VITKIT_MEASURE"  # 0: no measuring; the flag rules decide (CI and the tests set it)
# How `measure` times, recorded in every cache entry: an entry made another way is measured again. 2: the paths
# timed on the CPU whatever the default device (entries of 1, made under `vitkit bench`'s meta device, timed meta
# tensors and turned bf16 on where it is emulated); 3: oneDNN's linear in training timed on a block's four linears,
# not fc1 alone (entries of 2 turned it on where the whole step lost)
METHOD = 3
ENV_ROUNDS = "VITKIT_MEASURE_ROUNDS"  # paired rounds per path (default 15): fewer is quicker and noisier
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


@dataclass(frozen=True)
class Capabilities:
    """A machine's capabilities. Every field has a default, so a test can fake a machine kind by naming
    only what it has: Capabilities(vendor="AuthenticAMD", avx2=True)."""

    cpu: str = "unknown CPU"
    vendor: str = ""  # /proc/cpuinfo's vendor_id: AuthenticAMD, GenuineIntel, ... ("" when unknown)
    arch: str = "x86_64"
    cores: int = 1  # cores this process may run on
    avx2: bool = False
    avx512f: bool = False
    avx512_bf16: bool = False
    avx512_vnni: bool = False
    amx: bool = False  # AMX tiles (with bf16/int8 instructions)
    torch_isa: str = "DEFAULT"  # torch.backends.cpu.get_cpu_capability(): DEFAULT, AVX2, AVX512, ...
    onednn: bool = True  # torch built with oneDNN (mkldnn) and its fused linear op
    cuda: bool = False
    gpu: str | None = None
    cuda_capability: tuple[int, int] | None = None  # (major, minor) of device 0
    torch: str = ""
    capped_by: str = ""  # the environment caps that lowered the flags above (`apply_isa_caps`), "" when none

    @property
    def native_bf16(self) -> bool:
        """bf16 arithmetic in hardware on the CPU (not emulated through fp32)."""
        return self.avx512_bf16 or self.amx

    @property
    def kind(self) -> str:
        """The CPU kind the rules distinguish."""
        if self.avx512f and self.native_bf16:
            return "x86-64, AVX-512 with native bf16"
        if self.avx512f:
            return "x86-64, AVX-512 without native bf16"
        if self.avx2:
            return "x86-64, AVX2 (no AVX-512)"
        return f"{self.arch}, no AVX2"

    def isa_flags(self) -> list[str]:
        names = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx")
        return [n for n in names if getattr(self, n)]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["cuda_capability"] = list(self.cuda_capability) if self.cuda_capability else None
        return d | {"kind": self.kind, "native_bf16": self.native_bf16}


def parse_cpuinfo(text: str) -> tuple[str, str, set[str]]:
    """(model name, vendor_id, flags) from the first processor of a /proc/cpuinfo text."""
    model = vendor = ""
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, vendor, flags


def _torch_cpu(name: str) -> bool:
    fn = getattr(torch.cpu, name, None)  # private helpers of torch.cpu (torch >= 2.3); absent: not known
    try:
        return bool(fn()) if fn else False
    except RuntimeError:
        return False


# oneDNN's ISA names in ascending order (ONEDNN_MAX_CPU_ISA; the x86 ones that matter here)
ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
               "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "ALL")


def apply_isa_caps(flags: dict[str, bool], torch_isa: str, onednn_max: str | None) -> tuple[dict[str, bool], str]:
    """The instruction sets this process's kernels use, not just what the CPU has: ATEN_CPU_CAPABILITY (which
    torch reports back as `torch_isa`) caps torch's own kernels, ONEDNN_MAX_CPU_ISA caps oneDNN's (its matmuls,
    bf16 ones included). A Zen 4 run with both set to AVX2 gets AVX2 kernels and emulated bf16, so the rules
    must treat it as an AVX2 machine. Returns (lowered flags, the caps that lowered them, "" when none)."""
    out, why = dict(flags), []
    isa = torch_isa.upper()
    avx512 = dict(avx512f=False, avx512_bf16=False, avx512_vnni=False, amx=False)
    # an x86 CPU with these flags reports less only when ATEN_CPU_CAPABILITY told torch's kernels to stop there
    if isa == "DEFAULT" and flags.get("avx2"):
        out |= avx512 | dict(avx2=False)
        why.append("ATEN_CPU_CAPABILITY=default")
    elif isa == "AVX2" and flags.get("avx512f"):
        out |= avx512
        why.append("ATEN_CPU_CAPABILITY=avx2")
    cap = (onednn_max or "").strip().upper()
    if cap in ONEDNN_ISAS and cap != "ALL":
        rank = ONEDNN_ISAS.index
        lowered = {k: False for k, need in (("avx512f", "AVX512_CORE"), ("avx512_vnni", "AVX512_CORE_VNNI"),
                                            ("avx512_bf16", "AVX512_CORE_BF16"), ("amx", "AVX512_CORE_AMX"),
                                            ("avx2", "AVX2"))
                   if flags.get(k) and rank(cap) < rank(need)}  # named whenever it caps the CPU's own flags
        if lowered:
            out |= lowered
            why.append(f"ONEDNN_MAX_CPU_ISA={cap}")
    return out, ", ".join(why)


@functools.cache
def detect() -> Capabilities:
    """This machine's capabilities (read once per process)."""
    info = Path("/proc/cpuinfo")
    model, vendor, flags = parse_cpuinfo(info.read_text()) if info.exists() else ("", "", set())
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    torch_isa = torch.backends.cpu.get_cpu_capability()
    # the flags the kernel reports, or torch's own view (it reads CPUID through cpuinfo) where there are none
    isa, capped_by = apply_isa_caps(dict(
        avx2="avx2" in flags or _torch_cpu("_is_avx2_supported"),
        avx512f="avx512f" in flags or _torch_cpu("_is_avx512_supported"),
        avx512_bf16="avx512_bf16" in flags or _torch_cpu("_is_avx512_bf16_supported"),
        avx512_vnni="avx512_vnni" in flags or _torch_cpu("_is_vnni_supported"),
        amx="amx_bf16" in flags or _torch_cpu("_is_amx_tile_supported"),
    ), torch_isa, os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"))
    caps = dict(
        cpu=model or platform.processor() or platform.machine(), vendor=vendor, arch=platform.machine(),
        cores=cores, **isa, capped_by=capped_by, torch_isa=torch_isa,
        onednn=onednn.AVAILABLE,
        torch=torch.__version__,
    )
    if torch.cuda.is_available():
        caps |= dict(cuda=True, gpu=torch.cuda.get_device_name(0), cuda_capability=torch.cuda.get_device_capability(0))
    return Capabilities(**caps)


@dataclass(frozen=True)
class Decisions:
    """Which fast paths are on for one device, and why (one line per decision)."""

    device: str  # "cpu" or "cuda"
    bf16: bool  # bf16 for inference that asks for the fast precision
    bf16_training: bool  # bf16 autocast for training by default
    onednn_linear: bool  # inference (no grad)
    onednn_linear_training: bool  # under grad (training: forward and backward)
    matmul_attention: bool  # inference (no grad)
    matmul_attention_training: bool  # under grad (training: forward and backward)
    native_encoder: bool
    packed_linear: bool  # inference: linear weights packed once for their kernel, an MLP's GELU in fc1's matmul
    widened_bf16: bool  # inference: bf16 linears widened to fp32 on packed weights where bf16 is emulated
    widened_bf16_training: bool  # under grad: bf16 autocast linears widened to fp32 where bf16 is emulated
    channels_last_training: bool  # convolution weights (and so their outputs) in channels-last order in training
    onnx_runtime: bool
    why: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    def rows(self) -> list[tuple[str, bool, str]]:
        return [(name, getattr(self, name), self.why.get(name, "")) for name in DECISIONS]

    def to_dict(self) -> dict:
        return {"device": self.device, "precision": self.precision,
                "paths": {name: {"on": on, "why": why} for name, on, why in self.rows()}}


_UNMEASURED = "not measured on this kind of machine: the path timm takes"


def _bf16_rule(caps: Capabilities, device: str) -> tuple[bool, str]:
    if device == "cuda":
        cc = caps.cuda_capability
        if cc and cc >= (8, 0):
            return True, f"compute capability {cc[0]}.{cc[1]} >= 8.0: bf16 tensor cores"
        return False, f"compute capability {cc[0]}.{cc[1]} < 8.0: no bf16 tensor cores" if cc else "no CUDA device"
    if caps.native_bf16:
        return True, ("native bf16 (" + ("AMX" if caps.amx else "AVX512_BF16")
                      + "); Zen 4: fashion-mnist training steps 1841 img/s bf16 vs 878 fp32")
    return False, ("no native bf16 on this CPU (emulated through fp32); Zen 3: fashion-mnist training steps "
                   "< 43 img/s bf16 vs 306 fp32")


def _onednn_rule(caps: Capabilities, device: str) -> tuple[bool, str]:
    if device == "cuda":
        return False, "CPU only (CUDA runs cuBLAS)"
    if not caps.onednn:
        return False, "this torch build has no oneDNN linear"
    if caps.avx512f and caps.vendor == "AuthenticAMD":
        return True, "AMD with AVX-512: MKL sgemm takes its AVX2 path there; Zen 4: 1.4-1.8x timm in fp32"
    if caps.avx2 and not caps.avx512f:
        return False, "AVX2 only: MKL's AVX2 sgemm is as fast as it gets; Zen 3 with oneDNN: 0.88-0.89x timm"
    return False, _UNMEASURED


def _packed_rule(caps: Capabilities, device: str) -> tuple[bool, str]:
    if device == "cuda":
        return False, "CPU only"
    if not caps.onednn:
        return False, "this torch build has no oneDNN linear"
    if caps.amx:
        return True, "Xeon with AMX: ViT-S/16 inference 1.04-1.13x timm (fp32 and bf16, batch 1 and 8)"
    return False, _UNMEASURED


def _native_bf16_rule(measured: str, caps: Capabilities, device: str) -> tuple[bool, str]:
    if device == "cuda":
        return False, "measured on CPUs only; " + _UNMEASURED
    if caps.native_bf16:
        return True, f"native bf16; Zen 4: {measured}"
    return False, "no native bf16: " + _UNMEASURED


def _onnx_rule(caps: Capabilities, device: str) -> tuple[bool, str]:
    if device == "cuda":
        return False, "vitkit runs ONNX Runtime on the CPU only"
    if caps.native_bf16:
        return False, "bf16 eager is faster here; Zen 4: ViT-Ti batch 1 124 vs 59 img/s, ViT-S batch 8 63 vs 31"
    return False, _UNMEASURED + " (`vitkit bench --precisions fp32 --backends eager onnx` measures it)"


def decide(caps: Capabilities, device: str = "cpu", overrides: dict[str, bool] | None = None,
           measured: dict | None = None) -> Decisions:
    """The fast paths for `device` ("cpu" or "cuda") on a machine with `caps`. `measured` (a `measure` result)
    decides the CPU paths that no rule covers ("not measured"); `overrides` (decision -> on) replace any answer
    and say so."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu or cuda, got {device!r}")
    rules = {
        "bf16": _bf16_rule(caps, device),
        "bf16_training": _bf16_rule(caps, device),
        "onednn_linear": _onednn_rule(caps, device),
        "onednn_linear_training": _onednn_rule(caps, device),
        "matmul_attention": _native_bf16_rule("2-5x faster than SDPA's flash kernel; Zen 3 with it: 0.64x timm",
                                              caps, device),
        "matmul_attention_training": _native_bf16_rule("2-5x faster than SDPA's flash kernel", caps, device),
        "native_encoder": _native_bf16_rule("1.07x the module path", caps, device),
        "packed_linear": _packed_rule(caps, device),
        "widened_bf16": (False, "decided only by measuring, where oneDNN has no bf16 matmul: the AVX2 stand-in (a "
                                "Xeon capped at AVX2) measured bf16 ViT-S/16 inference 4.05-5.68x timm's; not measured "
                                "on a real CPU of that kind"),
        "widened_bf16_training": (False, "decided only by measuring, where oneDNN has no bf16 matmul: the AVX2 "
                                         "stand-in (a Xeon capped at AVX2) measured bf16-autocast training steps "
                                         "12.8-17.6x timm's; not measured on a real CPU of that kind"),
        "channels_last_training": (False, "off where measuring is off: timm trains convolutions in NCHW; when "
                                          "measuring, decided on each model's own training step (training/"
                                          "memory_format.py)"),
        "onnx_runtime": _onnx_rule(caps, device),
    }
    ratios = (measured or {}).get("ratios", {})
    for name in MEASURABLE:
        if device == "cpu" and isinstance(ratios.get(name), (int, float)):
            r, on = ratios[name], ratios[name] >= MEASURED_WIN
            rules[name] = (on, f"measured here ({measured.get('date', '?')}): {r:.2f}x timm's path, "
                           f"{'at least' if on else 'under'} {MEASURED_WIN}x (the flag rule says "
                           f"{'on' if rules[name][0] else 'off'})")
        elif device == "cpu" and name in ratios and ratios[name] is None:  # skipped: the reason is recorded
            reason = (measured.get("untimed") or {}).get(
                name, f"bf16 linears measured {ratios.get('bf16', 0):.2f}x fp32 here, emulated")
            rules[name] = (rules[name][0], f"{rules[name][1]} (not timed: {reason})")
    for name, on in (overrides or {}).items():
        if name not in rules:
            raise ConfigError(f"unknown fast path {name!r}; known: {', '.join(DECISIONS)}")
        rules[name] = (bool(on), f"set by {ENV_OVERRIDE} (the rule says {'on' if rules[name][0] else 'off'})")
    return Decisions(device=device, **{k: v[0] for k, v in rules.items()}, why={k: v[1] for k, v in rules.items()})


def parse_overrides(text: str | None) -> dict[str, bool]:
    """'onednn_linear=off,bf16=on' -> {'onednn_linear': False, 'bf16': True}."""
    out: dict[str, bool] = {}
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip().lower()
        if not sep or name not in DECISIONS or value not in _ON + _OFF:
            raise ConfigError(f"{ENV_OVERRIDE}: expected NAME=on|off with NAME one of {', '.join(DECISIONS)}, "
                              f"got {item!r}")
        out[name] = value in _ON
    return out


def this_machine(device: str = "cpu") -> Decisions:
    """The decisions for this machine: measured here (once, then cached per machine fingerprint) unless
    $VITKIT_MEASURE=0, where the flag rules decide; $VITKIT_FAST_PATHS overrides either."""
    caps = detect()
    measured = this_machines_measurement(caps) if device == "cpu" else None
    return decide(caps, device, parse_overrides(os.environ.get(ENV_OVERRIDE)), measured)


def measuring() -> bool:
    return os.environ.get(ENV_MEASURE, "1").strip().lower() not in _OFF


def measure_rounds(default: int = 15) -> int:
    text = os.environ.get(ENV_ROUNDS, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{ENV_ROUNDS}={text!r}: expected a whole number of rounds (default {default})")
    return int(text)


_MEASURED_IN_MEMORY: dict[str, dict] = {}  # measurements this process made but could not cache


def this_machines_measurement(caps: Capabilities) -> dict | None:
    """The cached measurement for this fingerprint; without one (and with measuring on), measured now, said
    in one line, and cached. A cache that cannot be read or written costs a note and a measurement kept in
    memory, never a failure."""
    import sys

    if not measuring():  # the flag rules decide, whatever a cache holds
        return None
    key = machine_key(caps)
    if key in _MEASURED_IN_MEMORY:
        return _MEASURED_IN_MEMORY[key]
    cached = cached_measurement(caps)
    if cached is not None:
        return cached
    print(f"vitkit: timing this machine's fast paths once (a few seconds; cached in {cache_file()}; "
          f"`vitkit doctor` shows them, {ENV_MEASURE}=0 skips this)", file=sys.stderr, flush=True)
    result = measure(measure_rounds())
    try:
        _write_entry(key, result)
    except OSError as e:  # measured once: kept for this process, not timed again
        _MEASURED_IN_MEMORY[key] = result
        _note_kept_in_memory(e)
    return result


def _note_kept_in_memory(e: OSError) -> None:
    import sys

    print(f"vitkit: note: could not cache the measurement ({getattr(e, 'strerror', None) or e}): kept for "
          "this process only", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- the one-time micro-benchmark
def cache_file() -> Path:
    return Path(os.environ.get("VITKIT_CACHE") or Path.home() / ".cache" / "vitkit") / "fast-paths.json"


def _read_cache() -> dict:
    """The cache file's entries by key: {} where there is no file, or it cannot be read, or is not a JSON object."""
    try:
        cache = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def _write_entry(key: str, entry: dict) -> None:
    """`entry` under `key`, beside the cache's other entries (an unreadable cache is replaced), written
    atomically; OSError where the file cannot be written."""
    from ._files import atomic_write_text

    atomic_write_text(cache_file(), json.dumps(_read_cache() | {key: entry}, indent=2) + "\n")


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "-"


@functools.cache
def _onednn_version() -> str:
    import re

    found = re.search(r"(?:oneDNN|MKL-DNN) v([\w.]+)", torch.__config__.show())
    return found.group(1) if found else "-"


def machine_key(caps: Capabilities) -> str:
    """The fingerprint a measurement holds for: the CPU model and the flags its kernels may use (caps
    included), cores and torch threads, and the versions of torch, oneDNN, ONNX Runtime and OpenVINO. Two
    machines with the same flags can differ 2x (issue 22), so nothing less than this machine is assumed."""
    return (f"{caps.cpu} | {','.join(caps.isa_flags()) or 'no AVX2'} | {caps.cores} cores | "
            f"{torch.get_num_threads()} threads | torch {caps.torch} | oneDNN {_onednn_version()} | "
            f"onnxruntime {_version('onnxruntime')} | openvino {_version('openvino')}")


def cached_measurement(caps: Capabilities) -> dict | None:
    """This machine's cached `measure` result, or None (no cache, another fingerprint, an unreadable file, an
    entry made by another METHOD)."""
    found = _read_cache().get(machine_key(caps))
    if not (isinstance(found, dict) and isinstance(found.get("ratios"), dict)) or found.get("method") != METHOD:
        return None  # not a measurement, or one made by another method (METHOD): measured again
    # a measurement from before a path was measurable is measured again, rather than deciding it by the rule
    return found if all(name in found["ratios"] for name in _measured_here()) else None


def _measured_here() -> tuple[str, ...]:
    """The MEASURABLE paths `measure` can time with this torch build (oneDNN's linear needs oneDNN)."""
    return tuple(n for n in MEASURABLE if n not in NEEDS_ONEDNN or onednn.AVAILABLE)


def _paired_median(a, b, rounds: int) -> float:
    """Median over rounds of time(a) / time(b), one call of each per round (order alternating): > 1, b is
    faster. Timed by the harness `vitkit bench` uses."""
    times = paired_times({"a": a, "b": b}, warmup=0, repeats=rounds)
    return paired_ratio(times["a"], times["b"])


def _slow_encoder_layer(layer, x):
    """The module path of an encoder layer: torch's fused fast path switched off for one call."""
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        return layer(x)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


def _block_linear_shapes(dim: int, mlp_ratio: int = 4) -> tuple[tuple[int, int], ...]:
    """(in, out) of a ViT block's four linears: qkv, proj, fc1, fc2."""
    return (dim, 3 * dim), (dim, dim), (dim, mlp_ratio * dim), (mlp_ratio * dim, dim)


def _packed_block(dtype: torch.dtype, kernel: str, rows: int, dim: int, rounds: int, g,
                  compute: torch.dtype | None = None) -> float:
    """The ratio unpacked path / packed path over one ViT block's linears on `rows` tokens of width `dim` in
    `dtype`: qkv, proj, GELU(fc1), fc2 by F.linear, timm's kernel, with fc1's GELU in place on its output (as Mlp runs
    inference without packed weights: the packing is credited with its own gain only), against weights packed for
    `kernel` (bf16 runs oneDNN) with fc1's GELU in the matmul where that is oneDNN, as layers.mlp.Linear and Mlp run
    them; `compute`: the packed side widens its operands to that dtype and rounds its outputs back (bf16 without
    oneDNN's kernel). Without the epilogue, fc1's GELU runs in place on the packed side too."""
    compute = compute or dtype
    shapes = _block_linear_shapes(dim)
    x, h = torch.randn(rows, dim, generator=g).to(dtype), torch.randn(rows, 4 * dim, generator=g).to(dtype)  # [T, .]
    ws = [torch.randn(d_out, d_in, generator=g).to(dtype) for d_in, d_out in shapes]  # [out, in]: qkv, proj, fc1, fc2
    wide = [w.to(compute) for w in ws]
    packs = [onednn.pack(w, rows, kernel) for w in wide]
    linear, gelu_ = torch.nn.functional.linear, torch.ops.aten.gelu_
    fused = kernel == "onednn" and compute == dtype

    def unpacked():
        return linear(x, ws[0]), linear(x, ws[1]), gelu_(linear(x, ws[2])), linear(h, ws[3])

    def run(i: int, inp: torch.Tensor) -> torch.Tensor:
        return onednn.packed_linear(inp.to(compute), packs[i], wide[i], None, kernel).to(dtype)

    def packed():
        fc1 = onednn.linear_gelu(x, packs[2]) if fused else gelu_(run(2, x))  # as Mlp runs it
        return run(0, x), run(1, x), fc1, run(3, h)

    return _paired_median(unpacked, packed, rounds)


def _attention(q, k, v, matmul: bool):
    """[B, H, N, Dh] -> [B, H, N, Dh]: SDPA (timm's path) or two matmuls + softmax."""
    if matmul:
        return ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(-1) @ v
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


class _TrainingBlock(torch.nn.Module):
    """A pre-norm ViT block from torch ops, to time a training step: LayerNorm, qkv, attention as chosen,
    projection, GELU MLP. Not layers/block.py's Block: this module sits below the layers and may not import them."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x, matmul: bool):
        B, N, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(B, N, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(_attention(q, k, v, matmul).transpose(1, 2).reshape(B, N, D))  # [B, N, D]
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


def _training_step(block, x, bf16: bool, matmul: bool = False):
    """One forward + backward of the block (bf16 autocast or fp32); gradients accumulate, which costs the same
    every call."""
    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            out = block(x, matmul)
        out.float().sum().backward()
    return step


def _linear_training_step(x, w, function=None, bf16: bool = False):
    """One forward + backward of the linear x @ w.T, by F.linear (timm's) or by `function`, the autograd function
    the layer runs in training (vitkit.onednn: OneDnnLinear in fp32, WidenedLinear under `bf16` autocast);
    gradients accumulate, which costs the same every call."""
    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            out = function.apply(x, w, None) if function else torch.nn.functional.linear(x, w)
        out.float().sum().backward()
    return step


def _block_linears_step(pairs, function=None):
    """One forward + backward of each linear (input, weight) in `pairs`, in one call: a block's linears, by F.linear
    or by `function` (`_linear_training_step`)."""
    steps = [_linear_training_step(x, w, function) for x, w in pairs]

    def step():
        for one in steps:
            one()
    return step


_WIDENED_NEVER_RUNS = "oneDNN has a bf16 matmul here, so the path never runs"
# training shapes [B, N, D, heads]: the fashion-mnist recipe's model (at half its batch: the ratio is the same,
# the time half), and ViT-S/16 at batch 8
TRAINING_SHAPES = ((64, 50, 192, 3), (8, 197, 384, 6))
# the fp32 linear in training, [tokens, width, MLP ratio] of a block whose four linears (qkv, proj, fc1, fc2) are timed
# together: the fashion-mnist recipe's model (128 wide, MLP ratio 2, 49 tokens, half its batch: its narrow width is
# where oneDNN's transposed copies in the backward cost most) and ViT-S/16 at batch 8. All four, not fc1 alone: under
# the AVX2 cap a Zen 5 measured fc1's step at 1.04x (on), while proj's and fc2's, timed apart, ran 0.80-1.02x and the
# bench's fp32 training steps 0.91-0.92x timm with the path on (BENCHMARKS.md, "A Zen 5 capped at AVX2")
LINEAR_TRAINING_BLOCKS = ((64 * 49, 128, 2), (8 * 197, 384, 4))


def measure(rounds: int = 15, tokens: int = 8 * 197, dim: int = 384, heads: int = 6) -> dict:
    """Time each MEASURABLE path against the path timm takes, at ViT-S/16 shapes (batch 8; the bf16 encoder
    layer at batch 2); a few seconds. Returns {"ratios": {path: timm_path_time / path_time}, "date": ...,
    "shapes": ..., "seconds": ...}; a ratio over 1 means the path is faster."""
    # on the CPU whatever device the caller made the default: a model built under `with torch.device("meta")`
    # (how `vitkit bench` sizes its models) asks for the decisions, and meta tensors would time nothing
    with torch.device("cpu"):
        return _measure(rounds, tokens, dim, heads)


def _measure(rounds: int, tokens: int, dim: int, heads: int) -> dict:
    import time

    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(tokens, dim, generator=g), torch.randn(4 * dim, dim, generator=g)  # MLP fc1: [T, D] x [4D, D]^T
    ratios, untimed = {}, {}
    with torch.inference_mode():
        if onednn.AVAILABLE:
            ratios["onednn_linear"] = _paired_median(lambda: torch.nn.functional.linear(x, w),
                                                     lambda: onednn.mm_t(x, w), rounds)
        xb, wb = x.bfloat16(), w.bfloat16()  # bf16 against fp32: the same product (emulated bf16 loses)
        ratios["bf16"] = _paired_median(lambda: torch.nn.functional.linear(x, w),
                                        lambda: torch.nn.functional.linear(xb, wb), rounds)
        # the other bf16 paths are timed only where bf16 is not emulated: under the AVX2 cap of a Zen 4 timing
        # them took 64 s (the issue allows 20), and with bf16 linears at a fifth of fp32 none of them can win
        bf16_timed = ratios["bf16"] >= EMULATED_BF16
        if onednn.AVAILABLE:
            fp32_kernel = "onednn" if ratios["onednn_linear"] >= MEASURED_WIN or not onednn.MKL_PACKED else "mkl"
            precisions = ((torch.float32, fp32_kernel), (torch.bfloat16, "onednn"))[:1 + (bf16_timed and onednn.BF16)]
            # at batch 1 and 8: the gain spans 1.04x (fp32, batch 8) to 1.2x (batch 1) on a Xeon with AMX, so the
            # ratio is their geometric mean, and it counts only where no case is slower than timm's path
            cases = [_packed_block(dtype, kernel, rows, dim, rounds, g) for dtype, kernel in precisions
                     for rows in (tokens // 8, tokens)]
            ratios["packed_linear"] = math.prod(cases) ** (1 / len(cases)) if min(cases) >= 1.0 else min(cases)
            # where oneDNN has no bf16 matmul, bf16 is widened to fp32 (layers.mlp.Linear.packed_plan), decided apart:
            # it wins by emulated bf16's loss, whatever the fp32 packing does (batch 1 only: emulated bf16 is slow
            # to time)
            if onednn.BF16:
                ratios["widened_bf16"] = None
                untimed["widened_bf16"] = _WIDENED_NEVER_RUNS
            else:
                ratios["widened_bf16"] = _packed_block(torch.bfloat16, fp32_kernel, tokens // 8, dim,
                                                       max(3, rounds // 3), g, compute=torch.float32)
        ratios["native_encoder"] = ratios["matmul_attention"] = None  # None: not timed, the flag rule decides
        if bf16_timed:
            layer = torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                                     batch_first=True, norm_first=True).eval().bfloat16()
            xe = torch.randn(2, 197, dim, generator=g).bfloat16()  # [B, N, D]
            ratios["native_encoder"] = _paired_median(lambda: _slow_encoder_layer(layer, xe), lambda: layer(xe),
                                                      max(3, rounds // 2))
            q, k, v = (torch.randn(tokens // 197, heads, 197, dim // heads, generator=g).bfloat16() for _ in range(3))
            ratios["matmul_attention"] = _paired_median(lambda: _attention(q, k, v, False),
                                                        lambda: _attention(q, k, v, True), rounds)
    # training, at each shape: bf16 attention under grad (SDPA vs matmul form), then the whole block in bf16 autocast
    # (with the faster attention) against fp32 (SDPA), and oneDNN's fp32 linear with its backward against F.linear's
    # (the inference linear won 1.16x on a Zen 4 whose fp32 training step then ran 0.82x timm). Each must win at
    # every shape to be the default: the shape where it loses would be someone's run
    matmul, training, linear = [], [], []
    few = max(2, rounds // 3)
    for b, n, d, h in TRAINING_SHAPES if bf16_timed else ():
        block = _TrainingBlock(d, h).train()
        xt = torch.randn(b, n, d, generator=g)  # [B, N, D]
        matmul.append(_paired_median(_training_step(block, xt, True, False), _training_step(block, xt, True, True),
                                     few))
        training.append(_paired_median(_training_step(block, xt, False),
                                       _training_step(block, xt, True, matmul[-1] >= MEASURED_WIN), few))
    for tokens_, d, ratio in LINEAR_TRAINING_BLOCKS if onednn.AVAILABLE else ():  # forward and both gradients
        pairs = []
        for d_in, d_out in _block_linear_shapes(d, ratio):
            pairs.append((torch.randn(tokens_, d_in, generator=g, requires_grad=True),  # [B*N, in]
                          torch.randn(d_out, d_in, generator=g, requires_grad=True)))  # [out, in]
        linear.append(_paired_median(_block_linears_step(pairs), _block_linears_step(pairs, onednn.OneDnnLinear),
                                     few))
    # bf16 autocast linears under grad where oneDNN has no bf16 matmul: emulated F.linear against the widened form,
    # forward and backward (small: emulated bf16 is slow to time)
    if onednn.AVAILABLE and not onednn.BF16:
        xw = torch.randn(256, 128, generator=g, requires_grad=True)  # [T, D]
        ww = torch.randn(256, 128, generator=g, requires_grad=True)  # [out, D]
        ratios["widened_bf16_training"] = _paired_median(_linear_training_step(xw, ww, bf16=True),
                                                         _linear_training_step(xw, ww, onednn.WidenedLinear, True),
                                                         few)
    elif onednn.AVAILABLE:
        ratios["widened_bf16_training"] = None
        untimed["widened_bf16_training"] = _WIDENED_NEVER_RUNS
    ratios["matmul_attention_training"] = min(matmul) if matmul else None
    ratios["bf16_training"] = min(training) if training else None
    if linear:
        ratios["onednn_linear_training"] = min(linear)
    return {"ratios": ratios, "untimed": untimed, "method": METHOD, "date": datetime.date.today().isoformat(),
            "shapes": {"tokens": tokens, "dim": dim, "heads": heads}, "rounds": rounds,
            "seconds": round(time.perf_counter() - t0, 2)}


def measure_and_cache(caps: Capabilities | None = None, rounds: int | None = None) -> dict:
    """`measure` and store the result for this machine in `cache_file()` (written atomically)."""
    caps = caps or detect()
    result = measure(rounds or measure_rounds())
    _write_entry(machine_key(caps), result)
    return result


def cached_model_ratio(what: str, signature: str, time_it, caps: Capabilities | None = None) -> tuple[float, bool]:
    """A paired ratio measured on one model (`what`: the decision, `signature`: the model and its input), cached
    beside this machine's fast-path entry (key: machine_key + what + signature). Returns (ratio, from_cache);
    `time_it()` measures it where the cache has none. A cache that cannot be read or written means measuring
    (kept in memory), never a failure."""
    key = f"{machine_key(caps or detect())} | {what} | {signature}"
    if key in _MEASURED_IN_MEMORY:
        return _MEASURED_IN_MEMORY[key]["ratio"], True
    found = _read_cache().get(key)
    if isinstance(found, dict) and isinstance(found.get("ratio"), (int, float)):
        return float(found["ratio"]), True
    entry = {"ratio": float(time_it()), "date": datetime.date.today().isoformat()}
    try:
        _write_entry(key, entry)
    except OSError as e:
        _MEASURED_IN_MEMORY[key] = entry
        _note_kept_in_memory(e)
    return entry["ratio"], False


def choose_precision(asked: str, recipe_bf16: bool, decisions: Decisions) -> tuple[str, str | None]:
    """The training precision ("bf16" or "fp32") and a one-line note when it is not what was asked.

    `asked` is "auto" (the recipe's `bf16`, where the hardware has native bf16), "bf16" (forced) or "fp32"."""
    if asked not in ("auto", "bf16", "fp32"):
        raise ConfigError(f"precision must be auto, bf16 or fp32, got {asked!r}")
    if asked != "auto":
        if asked == "bf16" and not decisions.bf16_training:
            return "bf16", f"note: bf16 forced although {decisions.why['bf16_training']}"
        return asked, None
    if recipe_bf16 and not decisions.bf16_training:
        return "fp32", (f"note: the recipe asks for bf16; training in fp32 instead: {decisions.why['bf16_training']} "
                        "(--precision bf16 forces it)")
    return ("bf16" if recipe_bf16 else "fp32"), None


def apply_fast_paths(model: torch.nn.Module, decisions: Decisions, *, training: bool = False) -> dict[str, int]:
    """Set each module's fast-path switch to the decision, where the module has that switch:
    `native_fastpath` (encoder blocks), `matmul_attention` and `matmul_attention_training` (attention), `onednn`,
    `onednn_training`, `packed`, `widened` and `widened_training` (linear layers; an MLP fuses its GELU where its
    fc1 is packed). `training` (a model about to be trained, before its optimiser is made): the convolutions'
    weights also take the order `channels_last_training` decided (counted as "channels_last").
    Returns how many modules each switch was set on."""
    switches = {"native_fastpath": decisions.native_encoder, "matmul_attention": decisions.matmul_attention,
                "matmul_attention_training": decisions.matmul_attention_training, "onednn": decisions.onednn_linear,
                "onednn_training": decisions.onednn_linear_training, "packed": decisions.packed_linear,
                "widened": decisions.widened_bf16, "widened_training": decisions.widened_bf16_training}
    counts = dict.fromkeys(switches, 0)
    for module in model.modules():
        for attr, on in switches.items():
            if isinstance(getattr(module, attr, None), bool):
                setattr(module, attr, on)
                counts[attr] += 1
    if training:
        convs = set_conv_order(model, decisions.channels_last_training)
        counts["channels_last"] = convs if decisions.channels_last_training else 0
    return counts


def set_conv_order(model: torch.nn.Module, channels_last: bool) -> int:
    """Every Conv2d's weight in channels-last or NCHW order, in place (the parameters stay the same objects, so
    an optimiser made before still holds them). Returns how many convolutions there are."""
    order = torch.channels_last if channels_last else torch.contiguous_format
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    for m in convs:
        m.to(memory_format=order)
    return len(convs)
