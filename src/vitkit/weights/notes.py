"""One-line notes to the user (on the `vitkit` logger), each said once per command, however many load paths
reach it (a command may read a checkpoint's header, then the checkpoint). `vitkit.cli.main` calls `reset()`
at the start of every command."""
from __future__ import annotations

import logging

log = logging.getLogger("vitkit")
_said: set[str] = set()


def note_once(message: str, level: int = logging.WARNING) -> None:
    if message not in _said:
        _said.add(message)
        log.log(level, message)


def reset() -> None:
    _said.clear()
