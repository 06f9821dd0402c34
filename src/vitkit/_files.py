"""Atomic file writes: write to a temp file in the same folder, fsync, then rename over the target.

A crash or a full disk at any moment leaves either the old file or the new one, never half of one. What a
killed write leaves behind has one pattern, vitkit's: a folder `.{name}.{pid}.{random}.tmp` beside the target
(older versions left files of that name). The next write of the same target removes it once its writer is
gone, and a training run clears its whole run folder of them when it starts or resumes.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path for `path` (an empty file); on success it replaces `path` atomically.

    The temporary file has `path`'s name inside a private folder beside it, so that a library that writes
    through a temp file of its own puts that inside too (safetensors writes a `.tmpXXXXXX` and renames it:
    killed mid-write, it used to leave e.g. an 88 MB training state as an anonymous `.tmp*` in a run folder),
    and a writer that reads the suffix sees the real one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    folder = Path(tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent))
    tmp_path = folder / path.name
    try:
        tmp_path.touch()  # writers may open it for update, as they could the mkstemp file used before
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp_path, 0o666 & ~_umask())  # a library's own temp file may be 0600: the usual permissions
        os.replace(tmp_path, path)  # the same filesystem (a folder beside the target): atomic
        with contextlib.suppress(OSError):  # make the rename itself durable
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# atomic_path's temps, `.{target}.{pid}.{random}.tmp` beside the target (mkdtemp's random part has no dot)
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.(?P<pid>\d+)\.[^.]+\.tmp$")


def _writer_gone(name: str, target: str | None = None, this_process_writes: bool = True) -> bool:
    """`name` is a temp of atomic_path's (for `target`, when given) whose writer no longer runs."""
    match = _TEMP_NAME.match(name)
    if not match or (target is not None and match["target"] != target):
        return False
    pid = int(match["pid"])
    if pid == os.getpid():
        return not this_process_writes
    return not _alive(pid)


def _remove(temp: Path) -> int | None:
    """Delete a stale temp (a folder of atomic_path's, or an older version's file) -> bytes freed, or None
    when it could not be removed (or went already). A link is never followed: it is not one of ours."""
    try:
        if temp.is_symlink():
            return None
        if temp.is_dir():
            size = sum(f.lstat().st_size for f in temp.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(temp)
            return size
        size = temp.lstat().st_size
        temp.unlink()
        return size
    except OSError:
        return None


def remove_stale_temps(path: Path) -> int:
    """Delete the temps of `path` left by writers that were killed (their process no longer exists)."""
    gone = [_remove(tmp) for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp")
            if _writer_gone(tmp.name, path.name)]
    return sum(size is not None for size in gone)


def remove_stale_temps_in(folder: str | os.PathLike) -> tuple[int, int]:
    """Delete every temp of atomic_path's in `folder` whose writer is gone -> (temps removed, bytes freed).

    For a caller that writes nothing in `folder` yet (a training run starting or resuming in its run
    folder): a temp named with this process's own pid is then an earlier process's that had the same pid
    (a container restarted after a kill hands out the same pids), so it goes too. Other files stay."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0, 0
    gone = [_remove(tmp) for tmp in folder.iterdir() if _writer_gone(tmp.name, this_process_writes=False)]
    freed = [size for size in gone if size is not None]
    return len(freed), sum(freed)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _alive(pid: int) -> bool:
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


def save_figure(fig, path: str | os.PathLike, dpi: int = 100) -> Path:
    """A matplotlib figure as a PNG at `path`, written atomically (a killed plot never leaves half a file)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    return path
