"""vitkit.data.images.load_image on real files of every awkward kind, broken files, bombs and fuzzed photos."""
from __future__ import annotations

import atexit
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vitkit.data.images import IMAGE_EXTENSIONS, MAX_PIXELS, is_image_file, load_image, load_tensor
from vitkit.errors import ImageError


def px(img: Image.Image, x: int, y: int) -> tuple[int, ...]:
    return tuple(int(v) for v in np.asarray(img)[y, x].reshape(-1))


def close(a, b, tol=6) -> bool:
    return all(abs(int(p) - int(q)) <= tol for p, q in zip(a, b))


# ------------------------------------------------------------------------------------------ good files
def test_cmyk_jpeg_becomes_rgb(tmp_path):
    path = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (32, 32), (0, 255, 255, 0)).save(path, quality=95)  # pure red in CMYK
    assert Image.open(path).mode == "CMYK"
    img = load_image(path)
    assert img.mode == "RGB" and img.size == (32, 32)
    assert close(px(img, 10, 10), (255, 0, 0))


def test_16bit_png_gradient_is_scaled_not_clipped(tmp_path):
    path = tmp_path / "g16.png"
    ramp = np.round(np.linspace(0, 65535, 256)).astype(np.uint16)  # one value per column
    Image.fromarray(np.tile(ramp, (8, 1))).save(path)
    assert Image.open(path).mode.startswith("I;16")
    img = load_image(path, channels=1)
    assert img.mode == "L"
    row = np.asarray(img)[0].astype(int)
    assert row[0] == 0 and row[-1] == 255
    assert np.all(np.diff(row) >= 0), "gradient must stay monotone"
    assert len(np.unique(row)) > 250, "a clipped conversion collapses the ramp to a few values"
    assert np.abs(row - ramp / 257.0).max() <= 1
    rgb = np.asarray(load_image(path))
    assert rgb.shape == (8, 256, 3) and np.array_equal(rgb[..., 0], rgb[..., 2])


def test_32bit_int_and_float_images(tmp_path):
    # 'I' with 16-bit-range data and 'F' in 0..1 (TIFF): scaled by their range
    Image.fromarray(np.array([[0, 65535]], dtype=np.int32), mode="I").save(tmp_path / "i.tif")
    assert px(load_image(tmp_path / "i.tif", channels=1), 1, 0) == (255,)
    Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32), mode="F").save(tmp_path / "f.tif")
    assert [px(load_image(tmp_path / "f.tif", 1), x, 0)[0] for x in range(3)] == [0, 128, 255]


def test_palette_with_transparency_composited_on_white(tmp_path):
    path = tmp_path / "pal.png"
    img = Image.new("P", (8, 8), 0)
    img.putpalette([0, 0, 0, 200, 30, 40] + [0] * 762)
    img.paste(1, (0, 0, 4, 8))  # left half opaque colour 1, right half colour 0 (transparent)
    img.save(path, transparency=0)
    out = load_image(path)
    assert out.mode == "RGB"
    assert px(out, 1, 1) == (200, 30, 40)
    assert px(out, 6, 1) == (255, 255, 255), "transparent pixels show white, not the hidden black"


def test_rgba_and_la_composited_on_white(tmp_path):
    a = np.zeros((4, 3, 4), np.uint8)
    a[:, 0] = (255, 0, 0, 255)  # opaque red
    a[:, 1] = (0, 0, 0, 0)  # fully transparent black
    a[:, 2] = (0, 0, 255, 128)  # half-transparent blue
    Image.fromarray(a, "RGBA").save(tmp_path / "rgba.png")
    out = load_image(tmp_path / "rgba.png")
    assert px(out, 0, 0) == (255, 0, 0)
    assert px(out, 1, 0) == (255, 255, 255)
    assert close(px(out, 2, 0), (127, 127, 255), tol=2)
    la = Image.fromarray(np.array([[[0, 0], [0, 255]]], np.uint8), "LA")
    la.save(tmp_path / "la.png")
    assert [px(load_image(tmp_path / "la.png", 1), x, 0)[0] for x in range(2)] == [255, 0]


@pytest.mark.parametrize("fmt", ["gif", "webp"])
def test_animation_gives_first_frame(tmp_path, fmt):
    path = tmp_path / f"anim.{fmt}"
    frames = [Image.new("RGB", (16, 16), c) for c in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0,
                   **({"lossless": True} if fmt == "webp" else {}))
    assert Image.open(path).n_frames == 3
    assert close(px(load_image(path), 8, 8), (255, 0, 0), tol=2)


@pytest.mark.parametrize("size", [(1, 1), (1, 4000), (4000, 1)])
def test_tiny_and_extreme_aspect(tmp_path, size):
    path = tmp_path / "thin.png"
    Image.new("RGB", size, (10, 20, 30)).save(path)
    out = load_image(path)
    assert out.size == size and px(out, 0, 0) == (10, 20, 30)
    assert tuple(load_tensor(path).shape) == (3, size[1], size[0])


def test_webp_lossless_exact(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)
    Image.fromarray(a).save(tmp_path / "x.webp", lossless=True)
    assert np.array_equal(np.asarray(load_image(tmp_path / "x.webp")), a)


def test_exif_orientation_applied(tmp_path):
    # stored 40 wide x 20 high: left half red, right half blue; orientation 6 = rotate 90 deg clockwise to view
    a = np.zeros((20, 40, 3), np.uint8)
    a[:, :20] = (255, 0, 0)
    a[:, 20:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(a).save(tmp_path / "rot.jpg", exif=exif.tobytes(), quality=95)
    out = load_image(tmp_path / "rot.jpg")
    assert out.size == (20, 40), "upright image is 20 wide x 40 high"
    assert close(px(out, 10, 5), (255, 0, 0), tol=12) and close(px(out, 10, 34), (0, 0, 255), tol=12)


def test_gray_request_and_file_is_closed(tmp_path):
    path = tmp_path / "rgb.png"
    Image.new("RGB", (5, 5), (255, 255, 255)).save(path)
    out = load_image(path, channels=1)
    assert out.mode == "L" and px(out, 0, 0) == (255,)
    os.remove(path)  # the decoded image does not depend on the file any more
    assert out.copy().size == (5, 5)


def test_is_image_file():
    assert is_image_file("a/B.JPG") and is_image_file("x.png") and is_image_file("x.webp")
    assert not is_image_file("x.txt") and not is_image_file("x") and not is_image_file("x.eps")
    assert {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".webp"} <= IMAGE_EXTENSIONS


# ------------------------------------------------------------------------------------------ bad files
def _refused(path, match, **kw) -> str:
    with pytest.raises(ImageError, match=match) as info:
        load_image(path, **kw)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def _photo_bytes(fmt: str, size: int = 96) -> bytes:
    from skimage import data

    img = Image.fromarray(data.astronaut()).resize((size, size))
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def test_missing_directory_empty(tmp_path):
    _refused(tmp_path / "nope.jpg", "no such file")
    (tmp_path / "x.jpg").mkdir()
    _refused(tmp_path / "x.jpg", "directory")
    (tmp_path / "empty.png").write_bytes(b"")
    _refused(tmp_path / "empty.png", "empty")


def test_text_with_image_extension(tmp_path):
    (tmp_path / "notes.jpg").write_text("this is not a picture\n" * 20)
    _refused(tmp_path / "notes.jpg", "not an image")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated(tmp_path, fmt):
    raw = _photo_bytes(fmt)
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(raw[: len(raw) // 2])
    _refused(path, "truncated|corrupt")
    path.write_bytes(raw)  # the whole file is fine
    assert load_image(path).size == (96, 96)


def test_eps_is_not_handed_to_ghostscript(tmp_path):
    path = tmp_path / "x.eps"
    path.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n%%EndComments\nshowpage\n")
    _refused(path, "not an image")


def _png_declaring(width: int, height: int) -> bytes:
    """A real 1x1 gray PNG whose IHDR is patched to declare width x height (CRC fixed up)."""
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, format="PNG")
    raw = bytearray(buf.getvalue())
    assert raw[12:16] == b"IHDR"
    raw[16:24] = struct.pack(">II", width, height)
    raw[29:33] = struct.pack(">I", zlib.crc32(bytes(raw[12:29])))
    return bytes(raw)


@pytest.mark.parametrize("w,h", [(100_000, 100_000), (9_000, 9_000)])
def test_decompression_bomb_refused_from_header(tmp_path, w, h):
    # 100000^2 trips Pillow's own bomb check; 9000^2 = 81 MP passes Pillow's (89 MP) but not ours (64 MP)
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_declaring(w, h))
    tracemalloc.start()
    try:
        msg = _refused(path, "decompression bomb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"{w}x{h}" in msg or "pixels" in msg
    assert peak < 5_000_000, f"{peak} bytes traced while refusing a bomb"


def test_bomb_allocates_no_pixel_memory(tmp_path):
    """In a fresh process whose address space is capped just above its current size, a 100000x100000 and a
    9000x9000 (243 MB if decoded to RGB) header are refused by the size check, not by running out of memory."""
    for name, (w, h) in {"big.png": (100_000, 100_000), "mid.png": (9_000, 9_000)}.items():
        (tmp_path / name).write_bytes(_png_declaring(w, h))
    code = f"""
import json, resource, sys
from vitkit.data.images import load_image
from vitkit.errors import ImageError
vm = int([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmSize')][0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 128 * 2**20, resource.RLIM_INFINITY))
out = []
for name in ("big.png", "mid.png"):
    try:
        load_image({str(tmp_path)!r} + "/" + name)
        out.append("loaded")
    except ImageError as e:
        out.append(str(e))
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    msgs = json.loads(res.stdout.strip().splitlines()[-1])
    assert all("decompression bomb" in m and "out of memory" not in m for m in msgs), msgs


def test_pixel_limit_is_configurable(tmp_path, monkeypatch):
    path = tmp_path / "img.png"
    Image.new("RGB", (100, 100)).save(path)
    _refused(path, "limit", max_pixels=5_000)
    assert load_image(path, max_pixels=10_000).size == (100, 100)
    from vitkit.data import images

    monkeypatch.setattr(images, "MAX_PIXELS", 9_999)
    _refused(path, "limit")
    assert MAX_PIXELS >= 16_000_000


def test_bad_channels_argument(tmp_path):
    Image.new("RGB", (2, 2)).save(tmp_path / "a.png")
    with pytest.raises(ImageError, match="channels"):
        load_image(tmp_path / "a.png", channels=4)


# ------------------------------------------------------------------------------------------ fuzzing
_SEEDS = {}


def _seed(fmt: str) -> bytes:
    if fmt not in _SEEDS:
        _SEEDS[fmt] = _photo_bytes(fmt, size=64)
    return _SEEDS[fmt]


_FUZZ_DIR = Path(tempfile.mkdtemp(prefix="vitkit-fuzz-"))
atexit.register(shutil.rmtree, _FUZZ_DIR, True)  # hypothesis examples cannot use tmp_path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(["PNG", "JPEG", "WEBP", "GIF"]),
       flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=12),
       keep=st.one_of(st.none(), st.floats(0, 1)))
def test_mutated_photos_load_or_raise_image_error(fmt, flips, keep):
    """Byte mutations and truncations of a real photo: a valid image or ImageError, nothing else."""
    raw = bytearray(_seed(fmt))
    for pos, value in flips:
        raw[int(pos * len(raw))] = value
    if keep is not None:
        raw = raw[: int(keep * len(raw))]
    path = _FUZZ_DIR / f"fuzz.{fmt.lower()}"
    path.write_bytes(bytes(raw))
    try:
        img = load_image(path, max_pixels=1_000_000)
    except ImageError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        return
    assert img.mode == "RGB" and img.width >= 1 and img.height >= 1
    assert np.asarray(img).shape == (img.height, img.width, 3)
