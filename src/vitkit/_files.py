"""Atomic file writes: write to a temp file in the same folder, fsync, then rename over the target.

A crash or a full disk at any moment leaves either the old file or the new one, never half of one.
"""
from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp_path, path)
        with contextlib.suppress(OSError):  # make the rename itself durable
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()


def remove_stale_temps(path: Path) -> int:
    """Delete temp files of `path` left by writers that were killed (their process no longer exists)."""
    removed = 0
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid_text = tmp.name[len(path.name) + 2:].split(".", 1)[0]
        if pid_text.isdigit() and _alive(int(pid_text)):
            continue
        with contextlib.suppress(OSError):
            tmp.unlink()
            removed += 1
    return removed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    with atomic_path(path) as tmp:
        write(tmp)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text))
