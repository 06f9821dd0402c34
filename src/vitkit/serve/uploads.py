"""Uploads to images, in memory only: the request body read under a size cap, the image taken from a
multipart form field or the raw body, and decoded with the same checks and conversions as
`vitkit.data.images.load_image` (decompression-bomb guard from the header, truncation is an error, EPS
refused). Nothing here opens, creates or names a path on the server's disk."""
from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread

from ..data.images import decode_image
from ..errors import VitkitError

FORM_FIELD = "file"  # the multipart field the image goes in (curl -F file=@photo.jpg)
RAW_TYPES = ("image/", "application/octet-stream")  # content types whose body is the image itself


class RequestError(VitkitError):
    """A request the server refuses, with the HTTP status to answer it with (always 4xx)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def upload_name(filename: str | None) -> str:
    """A client's file name made safe to echo in messages: the last path part, printable, at most 80 chars."""
    if not filename:
        return "upload"
    base = re.split(r"[\\/]", filename)[-1]
    clean = "".join(ch for ch in base if ch.isprintable())[:80].strip()
    return clean or "upload"


class UploadReader:
    """Requests to decoded images, with every limit: `max_upload_mb` on the image (413 above it),
    `upload_timeout_s` for the body to arrive (408 after it), `max_pixels` on the declared image size (None:
    `vitkit.data.images.MAX_PIXELS`). `service` gives the channel count and the model's preprocessing."""

    def __init__(self, service: Any, max_upload_mb: float, max_pixels: int | None, upload_timeout_s: float):
        self.service, self.max_upload_mb, self.max_pixels = service, max_upload_mb, max_pixels
        self.upload_timeout_s = upload_timeout_s
        self.upload_limit = int(max_upload_mb * 2**20)
        self.body_limit = self.upload_limit + 64 * 1024  # room for the multipart headers around the file
        # at most this many uploads are decoded at once: a 64 MP image is ~200 MB of pixels, so decoding is
        # bounded by the cores rather than by the thread pool's 40 threads
        self.decode_slots = anyio.CapacityLimiter(os.cpu_count() or 2)

    async def read(self, request, prepare: bool = False):
        """(decoded image, name, model input [C, H, W] when `prepare`) from the request, in memory; decoding
        and preprocessing run off the event loop, in one hop."""
        try:
            body = await asyncio.wait_for(read_body(request.stream(), request.headers.get("content-length"),
                                                    self.body_limit), self.upload_timeout_s)
        except asyncio.TimeoutError:
            raise RequestError(408, f"the upload did not arrive within {self.upload_timeout_s:g} s") from None
        data, image_name = await image_bytes(request.headers.get("content-type", ""), request.headers, body)
        if len(data) > self.upload_limit:
            raise RequestError(413, f"{image_name}: {len(data) / 2**20:.1f} MB is above the "
                               f"{self.max_upload_mb:g} MB limit")

        def decode():
            image = decode_image(data, self.service.channels, self.max_pixels, image_name)
            return image, image_name, self.service.prepare(image) if prepare else None

        return await anyio.to_thread.run_sync(decode, limiter=self.decode_slots)


async def read_body(stream: AsyncIterator[bytes], declared_length: str | None, limit: int) -> bytes:
    """The whole body, refused (413) as soon as it is known to exceed `limit` bytes: from Content-Length
    before reading anything, else while reading (chunked uploads)."""
    mb = limit / 2**20
    if declared_length is not None:
        try:
            declared = int(declared_length)
        except ValueError:
            raise RequestError(400, f"Content-Length {declared_length[:40]!r} is not a number") from None
        if declared > limit:
            raise RequestError(413, f"upload of {declared / 2**20:.1f} MB is above the {mb:g} MB limit")
    buf = bytearray()
    async for chunk in stream:
        buf += chunk
        if len(buf) > limit:
            raise RequestError(413, f"upload is above the {mb:g} MB limit")
    return bytes(buf)


async def image_bytes(content_type: str, headers, body: bytes) -> tuple[bytes, str]:
    """(image bytes, a name for messages) from a multipart form (field 'file') or a raw image body."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "multipart/form-data":
        data, name = await _from_form(headers, body)
    elif kind == "" or kind.startswith(RAW_TYPES):
        data, name = body, "upload"
    else:
        raise RequestError(415, f"content type {kind!r} is not accepted: send multipart/form-data with the image "
                           f"in the field '{FORM_FIELD}', or the raw image bytes as image/* or application/octet-stream")
    if not data:
        raise RequestError(400, f"{name}: the upload is empty (0 bytes)")
    return data, name


async def _from_form(headers, body: bytes) -> tuple[bytes, str]:
    from starlette.formparsers import MultiPartException, MultiPartParser

    class InMemoryParser(MultiPartParser):
        spool_max_size = 2**62  # the body is already in memory and capped: never roll a part over to a temp file

    async def once() -> AsyncIterator[bytes]:
        yield body

    try:
        form = await InMemoryParser(headers, once(), max_files=1, max_fields=16).parse()
    except MultiPartException as e:
        raise RequestError(400, f"malformed multipart form: {e.message}") from None
    try:
        upload = form.get(FORM_FIELD)
        if upload is None or isinstance(upload, str):
            files = [k for k, v in form.multi_items() if not isinstance(v, str)]
            got = f"file field(s) {files}" if files else "no file field"
            what = "a text value" if isinstance(upload, str) else got
            raise RequestError(400, f"send the image as a file in the multipart field '{FORM_FIELD}' (got {what})")
        return upload.file.read(), upload_name(upload.filename)
    finally:
        await form.close()
