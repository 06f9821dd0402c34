"""Loading image files the way a user expects, or refusing them with one clear line.

Every image file goes through `load_image`: it returns a fully decoded 'RGB' (or 'L') PIL image, or raises
`ImageError` naming the file. Choices (documented here because they change pixels):

- transparency (RGBA, LA, palette/gray/RGB with a tRNS colour) is composited onto WHITE, the way viewers
  and browsers show it, rather than dropping the alpha (which exposes whatever colour hides under it);
- 16-bit and float images ('I;16', 'I', 'F') are scaled to 8 bits by their range, never clipped:
  'I;16' and integer data within 0..65535 divide by 257; float data within 0..1 multiply by 255; data
  already within 0..255 is kept; anything else is min-max stretched;
- CMYK uses the embedded ICC profile when there is one (Pillow's plain CMYK->RGB otherwise);
- EPS is refused (Pillow would run Ghostscript on it);
- EXIF orientation is applied; animated GIF/WebP/APNG give their first frame;
- the file's own size and mode stay readable after conversion (`image_source`), so a caller can say what
  an image became;
- a declared size above `MAX_PIXELS` (or the `max_pixels` argument) is refused from the header alone,
  before any pixel memory is allocated; truncated files are errors (we never set LOAD_TRUNCATED_IMAGES).
"""
from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from ..errors import ImageError

MAX_PIXELS = 64_000_000  # 64 megapixels: ~8000x8000; a 100000x100000 header is a decompression bomb

# EPS is decoded by running the external Ghostscript interpreter on the file: a long history of code
# execution bugs, and never a training image. Everything else Pillow reads natively.
_REFUSED_FORMATS = frozenset({"EPS"})
# extensions Pillow can open (registered for a format that has an opener), lower case with the dot
IMAGE_EXTENSIONS = frozenset(ext.lower() for ext, fmt in Image.registered_extensions().items()
                             if fmt in Image.OPEN and fmt not in _REFUSED_FORMATS)
_FORMATS = tuple(fmt for fmt in Image.OPEN if fmt not in _REFUSED_FORMATS)

_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
_GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
SOURCE_INFO = "vitkit.source"  # key in a loaded image's .info: (width, height, mode) as read from the file


def is_image_file(path: str | os.PathLike) -> bool:
    """True when the file name has an extension Pillow can read (the content is not checked)."""
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def load_image(path: str | os.PathLike, channels: int = 3, max_pixels: int | None = None) -> Image.Image:
    """Decode `path` fully into an 'RGB' (channels=3) or 'L' (channels=1) image, or raise ImageError."""
    if channels not in (1, 3):
        raise ImageError(f"{path}: channels must be 1 or 3, got {channels}")
    limit = MAX_PIXELS if max_pixels is None else max_pixels
    path = Path(path)
    if not path.exists():
        raise ImageError(f"{path}: no such file")
    if path.is_dir():
        raise ImageError(f"{path}: is a directory, not an image file")
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ImageError(f"{path}: cannot read ({e.strerror or e})") from None
    if size == 0:
        raise ImageError(f"{path}: the file is empty (0 bytes)")

    return _decode(path, str(path), channels, limit)


def decode_image(data: bytes, channels: int = 3, max_pixels: int | None = None, name: str = "upload") -> Image.Image:
    """`load_image` for bytes in memory (an upload): the same checks and conversions in the same order, so
    the same bytes give the same pixels as the file; errors name `name`."""
    if channels not in (1, 3):
        raise ImageError(f"{name}: channels must be 1 or 3, got {channels}")
    if not data:
        raise ImageError(f"{name}: the upload is empty (0 bytes)")
    return _decode(io.BytesIO(data), name, channels, MAX_PIXELS if max_pixels is None else max_pixels)


def _decode(source, name: str, channels: int, limit: int) -> Image.Image:
    """Open `source` (a path or a binary file object), refuse a bomb from the header, decode fully, convert."""
    try:
        with warnings.catch_warnings():
            # Pillow warns (not raises) between its own limit and twice it: treat that as a refusal too
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source, formats=_FORMATS) as img:  # reads the header only
                w, h = img.size
                if w * h > limit:
                    raise ImageError(f"{name}: declared size {w}x{h} = {w * h / 1e6:.3g} megapixels is above "
                                     f"the {limit / 1e6:.3g} megapixel limit (possible decompression bomb); "
                                     "raise vitkit.data.images.MAX_PIXELS if the image is genuine")
                img.seek(0)  # first frame of animations
                img.load()  # force the full decode now: truncation and corrupt data surface here
                img = ImageOps.exif_transpose(img)
                src = (img.width, img.height, img.mode)
                out = _to_mode(img, channels, name)
                out.info[SOURCE_INFO] = src
                return out
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"{name}: refused as a possible decompression bomb ({_one_line(e)})") from None
    except Image.UnidentifiedImageError:
        raise ImageError(f"{name}: not an image file Pillow can read (unknown or corrupt format)") from None
    except PermissionError as e:
        raise ImageError(f"{name}: cannot read ({e.strerror or e})") from None
    except MemoryError:
        raise ImageError(f"{name}: out of memory while decoding (image too large or corrupt)") from None
    except Exception as e:  # noqa: BLE001  corrupt data raises many types inside Pillow's plugins
        raise ImageError(f"{name}: corrupt or truncated image ({type(e).__name__}: {_one_line(e)})") from None


def image_source(img: Image.Image) -> tuple[int, int, int, str] | None:
    """What a `load_image` result was in its file, before conversion: (width, height, channels, mode),
    channels 1 for gray modes ('L', '1', 'I;16', 'F', 'LA', ...) and 3 for colour ones; None for an image
    that did not come from `load_image`."""
    src = img.info.get(SOURCE_INFO)
    if not src:
        return None
    w, h, mode = src
    return int(w), int(h), (1 if mode in _GRAY_MODES else 3), str(mode)


def load_tensor(path: str | os.PathLike, channels: int = 3, max_pixels: int | None = None):
    """`load_image` as a uint8 tensor [C, H, W]."""
    from torchvision.transforms.v2.functional import pil_to_tensor

    return pil_to_tensor(load_image(path, channels, max_pixels))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:200] if text else type(e).__name__


def _to_mode(img: Image.Image, channels: int, path: Path | str) -> Image.Image:
    mode = img.mode
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        gray = _scale_to_8bit(np.asarray(img))  # [H, W] uint8
        out = Image.fromarray(gray, mode="L")
        return out if channels == 1 else out.convert("RGB")
    if mode == "CMYK":
        img = _cmyk_to_rgb(img)
    elif mode == "1":
        img = img.convert("L")
    elif mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif mode in ("L", "RGB") and "transparency" in img.info:  # a tRNS colour key
        img = img.convert("RGBA" if mode == "RGB" else "LA")
    if img.mode in _ALPHA_MODES:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, rgba).convert("RGB")
    target = "L" if channels == 1 else "RGB"
    if img.mode != target:
        try:
            img = img.convert(target)
        except (ValueError, OSError) as e:
            raise ImageError(f"{path}: cannot convert image mode {mode} to {target} ({_one_line(e)})") from None
    else:
        img = img.copy()  # detach from the (closing) file
    return img


def _scale_to_8bit(a: np.ndarray) -> np.ndarray:
    """16-bit / int32 / float pixels -> uint8 by the smallest standard range that holds them (no clipping)."""
    is_float = a.dtype.kind == "f"
    a = a.astype(np.float64)
    finite = a[np.isfinite(a)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    if is_float and lo >= 0 and hi <= 1:
        scaled = a * 255.0
    elif lo >= 0 and hi <= 255:
        scaled = a
    elif lo >= 0 and hi <= 65535:
        scaled = a / 257.0
    else:  # outside any standard range: stretch min..max
        scaled = (a - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(a)
    return np.clip(np.nan_to_num(np.round(scaled), nan=0.0), 0, 255).astype(np.uint8)


def _cmyk_to_rgb(img: Image.Image) -> Image.Image:
    icc = img.info.get("icc_profile")
    if icc:
        try:
            from PIL import ImageCms

            src = ImageCms.ImageCmsProfile(io.BytesIO(icc))
            dst = ImageCms.createProfile("sRGB")
            return ImageCms.profileToProfile(img, src, dst, outputMode="RGB")
        except Exception:  # noqa: BLE001, S110  a broken or unsupported profile: use the plain conversion
            pass
    return img.convert("RGB")
