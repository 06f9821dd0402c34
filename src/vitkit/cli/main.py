"""`vitkit` command line. Each subcommand lives in its own module in this package and exposes
`register(subparsers)`; modules are discovered, so adding a command touches no shared file."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys

from ..errors import VitkitError

_SKIP = {"main", "common"}


class OneLineParser(argparse.ArgumentParser):
    """Argument errors as one line (`vitkit train: error: ...`), not a usage dump."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    parser = OneLineParser(prog="vitkit", description="Vision Transformers: build, import, train, "
                                     "inspect and ship.")
    parser.add_argument("--version", action="version", version=f"vitkit {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more (info level)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    from . import __path__ as cli_path

    for mod in sorted(m.name for m in pkgutil.iter_modules(cli_path)):
        if mod not in _SKIP:
            module = importlib.import_module(f"{__package__}.{mod}")
            if hasattr(module, "register"):
                module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command (`argv`, or the process's own arguments as the `vitkit` program) and return its exit code."""
    rc = _run(argv)
    if argv is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_without_finalizing(rc)
    return rc


def _exit_without_finalizing(rc: int) -> None:
    """End a torchrun worker here, its files written and its process group destroyed, before the interpreter
    shuts down. Gloo's worker threads free finished collectives asynchronously; the last ones hold tensors whose
    release takes the GIL, and a thread that asks for the GIL while the interpreter is finalizing aborts the
    process (SIGABRT, "terminate called without an active exception": the core dump of a `vitkit train
    --strategy fsdp` rank showed ProcessGroupGloo::runLoop freeing an all-gather from inside
    Py_FinalizeEx). destroy_process_group does not stop those threads while DTensor's caches still hold the
    mesh, so the only safe end is not to finalize: flush what is buffered and leave."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed (`| head`)
            pass
    os._exit(rc)


def _run(argv: list[str] | None) -> int:
    from ..weights.notes import reset

    reset()  # each command says each note once
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="vitkit: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
        return int(rc or 0)
    except VitkitError as e:
        print(f"vitkit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `vitkit models | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as e:
        if not getattr(e, "reported", False):  # e.g. training already said where its resumable state is
            print(f"vitkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        print(f"vitkit {args.command}: error: {e.strerror or e}: {e.filename}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug: still one line by default, the traceback on request
        if os.environ.get("VITKIT_DEBUG"):
            raise
        print(f"vitkit {args.command}: internal error: {type(e).__name__}: {e} "
              "(set VITKIT_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
