"""Broken, hostile and mismatched checkpoints against the real loaders; atomic writes under a full disk."""
from __future__ import annotations

import atexit
import errno
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import vitkit
from vitkit._files import atomic_path, atomic_write
from vitkit.errors import CheckpointError, VitkitError
from vitkit.layers import resample_pos_embed
from vitkit.weights.io import FORMAT_VERSION, META_PREFIX, read_any

PICO = "vit_pico_patch2_8"  # 96 wide, depth 4, 1 channel, 8x8: 0.3M parameters


@pytest.fixture(scope="module")
def pico(tmp_path_factory):
    """A real pico model saved as a vitkit file, a plain (timm-style) safetensors, a .pth and an .npz."""
    d = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    model = vitkit.create_model(PICO)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    vitkit.save_model(model, d / "vitkit.safetensors")
    save_file(sd, str(d / "plain.safetensors"))
    torch.save(sd, d / "plain.pth")
    np.savez(d / "plain.npz", **{k: v.numpy() for k, v in sd.items()})
    return {"dir": d, "model": model, "sd": sd}


def _loaders(path):
    """Every public way to read a checkpoint file."""
    return {
        "read_any": lambda: read_any(path),
        "load_model": lambda: vitkit.load_model(path),
        "create_model": lambda: vitkit.create_model(PICO, checkpoint_path=path),
    }


def _all_refuse(path, match: str) -> list[str]:
    msgs = []
    for name, load in _loaders(path).items():
        with pytest.raises(CheckpointError, match=match) as info:
            load()
        msg = str(info.value)
        assert "\n" not in msg, f"{name}: message is not one line: {msg!r}"
        msgs.append(msg)
    return msgs


# ------------------------------------------------------------------------------------------ unreadable files
@pytest.mark.parametrize("name", ["w.safetensors", "w.pth", "w.npz", "w.bin", "weights"])
def test_zero_byte_file(tmp_path, name):
    (tmp_path / name).write_bytes(b"")
    _all_refuse(tmp_path / name, "empty")


def test_missing_path_and_empty_directory(tmp_path):
    _all_refuse(tmp_path / "nope.safetensors", "no such file")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    _all_refuse(tmp_path / "hf", "directory without")


def test_directory_with_broken_config(tmp_path, pico):
    (tmp_path / "hf").mkdir()
    shutil.copy(pico["dir"] / "plain.safetensors", tmp_path / "hf" / "model.safetensors")
    (tmp_path / "hf" / "config.json").write_text("{not json")
    _all_refuse(tmp_path / "hf", "invalid JSON")


@pytest.mark.parametrize("cut", ["7", "header", "data", "last"])
def test_truncated_safetensors(tmp_path, pico, cut):
    raw = (pico["dir"] / "vitkit.safetensors").read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    keep = {"7": 7, "header": 8 + header_len // 2, "data": 8 + header_len + 1000, "last": len(raw) - 1}[cut]
    path = tmp_path / "cut.safetensors"
    path.write_bytes(raw[:keep])
    _all_refuse(path, "truncated|corrupted|not a readable")


@pytest.mark.parametrize("damage", ["json", "length", "dtype", "offsets"])
def test_corrupted_safetensors_header(tmp_path, pico, damage):
    raw = bytearray((pico["dir"] / "vitkit.safetensors").read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + n].decode()
    if damage == "json":
        raw[8] = ord("x")  # '{' -> 'x'
    elif damage == "length":
        raw[:8] = (2**62).to_bytes(8, "little")  # a header longer than the file (and than memory)
    else:
        old, new = ('"F32"', '"Q32"') if damage == "dtype" else ('"data_offsets":[0,', '"data_offsets":[9,')
        assert old in header
        patched = header.replace(old, new, 1).encode()
        raw[8:8 + n] = patched
    path = tmp_path / "bad.safetensors"
    path.write_bytes(bytes(raw))
    _all_refuse(path, "not a readable safetensors")


# ------------------------------------------------------------------------------------------ hostile pickles
class _SystemPayload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):  # unpickling runs os.system("touch MARKER")
        return os.system, (f"touch {self.marker}",)


class _ExecPayload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):  # unpickling runs exec(...) writing MARKER
        return exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",)


_PAYLOADS = [_SystemPayload, _ExecPayload]
_CONTAINERS = ["zip.pth", "legacy.pth", "zip.bin", "plain.ckpt"]


def _make_evil(d: Path, sd, payload, container: str) -> tuple[Path, Path]:
    kind, ext = container.split(".")
    marker = d / f"MARKER-{payload.__name__}-{kind}-{ext}"
    path = d / f"evil-{payload.__name__}-{kind}.{ext}"
    if kind == "plain":  # a bare pickle (no torch container, no tensors), payload first in the stream
        path.write_bytes(pickle.dumps([payload(marker), {"w": [1.0, 2.0]}], protocol=2))
    else:
        torch.save({"state_dict": dict(sd), "trainer": payload(marker)}, path,
                   _use_new_zipfile_serialization=(kind == "zip"))
    return path, marker


@pytest.mark.parametrize("payload", _PAYLOADS)
@pytest.mark.parametrize("container", _CONTAINERS)
def test_malicious_pickle_never_runs(tmp_path, pico, payload, container):
    path, marker = _make_evil(tmp_path, pico["sd"], payload, container)
    if container.startswith("plain"):
        _all_refuse(path, "refused|not a readable")
    else:
        msgs = _all_refuse(path, "refused")
        assert any(("system" in m) or ("exec" in m) for m in msgs), msgs[0]  # names what was refused
    assert not marker.exists(), "the payload ran"


def test_malicious_pickles_are_live(tmp_path, pico):
    """Control: every hostile file above DOES run its payload under an unsafe loader, so the refusals mean
    something (one subprocess for all of them)."""
    made = [_make_evil(tmp_path, pico["sd"], p, c) for p in _PAYLOADS for c in _CONTAINERS]
    code = "import pickle, sys, torch\nfor p in sys.argv[1:]:\n" \
           "    torch.load(p, weights_only=False) if not p.endswith('.ckpt') else pickle.load(open(p, 'rb'))\n"
    res = subprocess.run([sys.executable, "-c", code, *[str(p) for p, _ in made]], capture_output=True, text=True,
                         timeout=180, check=False)
    assert res.returncode == 0, res.stderr[-1000:]
    assert all(m.exists() for _, m in made), [m.name for _, m in made if not m.exists()]


def test_npz_with_pickled_object_refused(tmp_path, pico):
    marker = tmp_path / "MARKER"
    arrays = {k: v.numpy() for k, v in pico["sd"].items()}
    arrays["evil"] = np.array([_SystemPayload(marker)], dtype=object)
    np.savez(tmp_path / "evil.npz", **arrays)
    with pytest.raises(CheckpointError, match="npz"):
        read_any(tmp_path / "evil.npz")
    with pytest.raises(CheckpointError):
        vitkit.load_model(tmp_path / "evil.npz")
    assert not marker.exists()


# ------------------------------------------------------------------------------------------ mismatches
def test_wrong_architecture_names_key_and_shapes(tmp_path):
    torch.manual_seed(0)
    tiny = vitkit.create_model("vit_tiny_patch4_28")  # 192 wide, 1 channel
    vitkit.save_model(tiny, tmp_path / "tiny.safetensors")
    save_file({k: v.contiguous() for k, v in tiny.state_dict().items()}, str(tmp_path / "tiny_plain.safetensors"))
    for path in (tmp_path / "tiny.safetensors", tmp_path / "tiny_plain.safetensors"):
        for load in (lambda p=path: vitkit.create_model("vit_small_patch4_32", checkpoint_path=p),
                     lambda p=path: vitkit.load_model(p, model_name="vit_small_patch4_32")):
            with pytest.raises(CheckpointError, match=r"shape mismatch for \S+: checkpoint \(.*\) vs model \(.*\)") as e:
                load()
            assert "192" in str(e.value) and "384" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["vitkit", "plain"])
def test_half_precision_weights_load_and_are_cast(tmp_path, pico, dtype, kind):
    """Decision: fp16/bf16 checkpoints load into a float32 model, values = the stored half values."""
    half = {k: v.to(dtype) if v.is_floating_point() else v for k, v in pico["sd"].items()}
    path = tmp_path / "half.safetensors"
    if kind == "vitkit":
        from vitkit.weights.io import save_checkpoint

        save_checkpoint(path, half, pico["model"].cfg.to_dict())
        model = vitkit.load_model(path)
    else:
        save_file(half, str(path))
        model = vitkit.create_model(PICO, checkpoint_path=path)
    got = model.state_dict()
    assert all(t.dtype == torch.float32 for t in got.values() if t.is_floating_point())
    for k, v in half.items():
        assert torch.equal(got[k], v.float()), k
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(2, 1, 8, 8))).all()


def test_missing_and_unexpected_keys_listed(tmp_path, pico):
    sd = dict(pico["sd"])
    del sd["blocks.1.attn.qkv.weight"], sd["norm.bias"]
    sd["aux_head.weight"] = torch.zeros(3)
    from vitkit.weights.io import save_checkpoint

    save_checkpoint(tmp_path / "vk.safetensors", sd, pico["model"].cfg.to_dict())
    save_file(sd, str(tmp_path / "plain.safetensors"))
    for path in (tmp_path / "vk.safetensors", tmp_path / "plain.safetensors"):
        for load in (lambda p=path: vitkit.create_model(PICO, checkpoint_path=p), lambda p=path: vitkit.load_model(p)):
            with pytest.raises(CheckpointError) as e:
                load()
            msg = str(e.value)
            assert "\n" not in msg
            if "missing" in msg:  # create_model / vitkit files: the full key report
                for key in ("blocks.1.attn.qkv.weight", "norm.bias", "aux_head.weight"):
                    assert key in msg, (path.name, msg)
                assert "unexpected" in msg
            else:  # load_model on a foreign file infers the architecture first and may stop there
                assert "blocks" in msg or "norm" in msg, msg


def _rewrite_meta(src: Path, dst: Path, **changes):
    from safetensors import safe_open

    with safe_open(str(src), "pt") as f:
        meta = dict(f.metadata())
    meta.update({META_PREFIX + k: v for k, v in changes.items()})
    save_file(load_file(str(src)), str(dst), metadata=meta)


def test_format_version_from_the_future(tmp_path, pico):
    path = tmp_path / "future.safetensors"
    _rewrite_meta(pico["dir"] / "vitkit.safetensors", path, format_version=str(FORMAT_VERSION + 1))
    for load in (lambda: vitkit.load_model(path), lambda: vitkit.create_model(PICO, checkpoint_path=path)):
        with pytest.raises(CheckpointError, match="newer vitkit"):
            load()
    _rewrite_meta(pico["dir"] / "vitkit.safetensors", path, format_version="v2-beta")
    with pytest.raises(CheckpointError, match="format version"):
        vitkit.load_model(path)
    _rewrite_meta(pico["dir"] / "vitkit.safetensors", path, config="{broken")
    with pytest.raises(CheckpointError, match="config"):
        vitkit.load_model(path)


def test_good_files_still_load(pico):
    """The fixtures themselves are valid, so every refusal above is about the damage."""
    x = torch.randn(2, 1, 8, 8)
    ref = pico["model"].eval()(x)
    for name in ("vitkit.safetensors", "plain.safetensors", "plain.pth", "plain.npz"):
        model = vitkit.create_model(PICO, checkpoint_path=pico["dir"] / name).eval()
        assert torch.allclose(model(x), ref, atol=1e-6), name
    assert torch.allclose(vitkit.load_model(pico["dir"] / "vitkit.safetensors").eval()(x), ref, atol=1e-6)


# ------------------------------------------------------------------------------------------ property tests
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@settings(max_examples=120, deadline=None)
@given(old=st.tuples(st.integers(1, 12), st.integers(1, 12)), new=st.tuples(st.integers(1, 12), st.integers(1, 12)),
       prefix=st.integers(0, 4), dim=st.integers(1, 8), dtype=st.sampled_from(_DTYPES),
       mode=st.sampled_from(["bicubic", "bilinear", "nearest"]), seed=st.integers(0, 2**16))
def test_resample_pos_embed_properties(old, new, prefix, dim, dtype, mode, seed):
    g = torch.Generator().manual_seed(seed)
    pe = torch.randn(1, prefix + old[0] * old[1], dim, generator=g).to(dtype)
    out = resample_pos_embed(pe, new, old, prefix, interpolation=mode)
    assert out.shape == (1, prefix + new[0] * new[1], dim) and out.dtype == dtype
    assert torch.equal(out[:, :prefix], pe[:, :prefix]), "prefix rows must be untouched bit for bit"
    assert torch.isfinite(out.float()).all()
    if new == old:
        assert torch.equal(out, pe)
    # a constant grid stays constant: the interpolation weights sum to one
    const = torch.cat([pe[:, :prefix], torch.full((1, old[0] * old[1], dim), 0.5, dtype=dtype)], dim=1)
    grid = resample_pos_embed(const, new, old, prefix, interpolation=mode)[:, prefix:].float()
    assert torch.allclose(grid, torch.full_like(grid, 0.5), atol=1e-3)


_FUZZ_DIR = Path(tempfile.mkdtemp(prefix="vitkit-ckpt-fuzz-"))
atexit.register(shutil.rmtree, _FUZZ_DIR, True)  # hypothesis examples cannot use tmp_path
_SEED_FILES: dict[str, bytes] = {}


def _seed_bytes(kind: str) -> bytes:
    if not _SEED_FILES:
        torch.manual_seed(0)
        model = vitkit.create_model(PICO)
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        vitkit.save_model(model, _FUZZ_DIR / "seed.safetensors")
        np.savez(_FUZZ_DIR / "seed.npz", **{k: v.numpy() for k, v in sd.items()})
        np.savez_compressed(_FUZZ_DIR / "seedz.npz", **{k: v.numpy() for k, v in sd.items()})
        torch.save(sd, _FUZZ_DIR / "seed.pth")
        for name in ("safetensors", "npz", "npzc", "pth"):
            file = {"npzc": "seedz.npz"}.get(name, f"seed.{name}")
            _SEED_FILES[name] = (_FUZZ_DIR / file).read_bytes()
    return _SEED_FILES[kind]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["safetensors", "npz", "npzc", "pth"]),
       keep=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)),
       flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=6),
       near_start=st.booleans())
def test_damaged_checkpoints_read_or_checkpoint_error(kind, keep, flips, near_start):
    """Truncations and byte flips of a real checkpoint: read_any loads it or raises CheckpointError."""
    raw = bytearray(_seed_bytes(kind))
    assume(keep is not None or flips)
    for pos, value in flips:
        # headers live at the start (safetensors) or the end (zip directory): aim half the flips there
        span = min(len(raw), 4096)
        at = int(pos * span) if near_start else len(raw) - 1 - int(pos * span)
        raw[at] = value
    if keep is not None:
        raw = raw[: int(keep * len(raw))]
    path = _FUZZ_DIR / ("fuzz.npz" if kind == "npzc" else f"fuzz.{kind}")
    path.write_bytes(bytes(raw))
    try:
        sd, meta, _ = read_any(path)
    except CheckpointError as e:
        assert "\n" not in str(e)
        return
    assert isinstance(sd, dict) and isinstance(meta, dict)
    # what reads must then load into a model or fail with a vitkit error, never a crash
    try:
        vitkit.load_model(path)
    except VitkitError as e:
        assert "\n" not in str(e)


# ------------------------------------------------------------------------------------------ atomic writes
def _tree(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_atomic_write_failing_midway_keeps_old_file(tmp_path):
    target = tmp_path / "ckpt.bin"
    target.write_bytes(b"OLD" * 1000)
    before = target.read_bytes()

    def half_then_full_disk(tmp: Path):
        with open(tmp, "wb") as f:
            f.write(b"NEW" * 500)
            f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OSError) as e:
        atomic_write(target, half_then_full_disk)
    assert e.value.errno == errno.ENOSPC
    assert target.read_bytes() == before
    assert _tree(tmp_path) == ["ckpt.bin"], "temp file left behind"

    with pytest.raises(KeyboardInterrupt), atomic_path(target) as tmp:  # an interrupt midway behaves the same
        tmp.write_bytes(b"partial")
        raise KeyboardInterrupt
    assert target.read_bytes() == before and _tree(tmp_path) == ["ckpt.bin"]

    atomic_write(target, lambda p: p.write_bytes(b"NEW"))  # and a good write replaces it
    assert target.read_bytes() == b"NEW" and _tree(tmp_path) == ["ckpt.bin"]


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 2 MiB tmpfs (needs root and mount permission; skipped otherwise)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_save_model_on_full_disk_keeps_previous_checkpoint(tiny_disk):
    target = tiny_disk / "model.safetensors"
    torch.manual_seed(0)
    small = vitkit.create_model(PICO)  # 1.2 MB file: fits
    vitkit.save_model(small, target)
    before = target.read_bytes()
    big = vitkit.create_model("vit_tiny_patch4_28")  # ~11 MB: the disk fills midway
    with pytest.raises(CheckpointError, match="could not write") as e:
        vitkit.save_model(big, target)
    assert "\n" not in str(e.value)
    assert target.read_bytes() == before
    assert _tree(tiny_disk) == ["model.safetensors"], "temp file left behind on the full disk"
    reloaded = vitkit.load_model(target)
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), small.state_dict().values()))


def test_stale_temp_files_of_dead_writers_are_removed(tmp_path):
    """A writer killed mid-write leaves `.NAME.<pid>.xxxx.tmp`; the next write to NAME removes it,
    but never the temp file of a writer that is still alive."""
    from vitkit._files import atomic_write_text

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".ckpt.json.{dead_pid}.abc123.tmp"
    stale.write_text("half")
    live = tmp_path / f".ckpt.json.{os.getppid()}.def456.tmp"
    live.write_text("in progress")
    atomic_write_text(tmp_path / "ckpt.json", "{}")
    assert not stale.exists() and live.exists()
    assert (tmp_path / "ckpt.json").read_text() == "{}"
