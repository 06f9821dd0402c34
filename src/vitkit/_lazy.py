"""Names a package exports but imports on first use (PEP 562), so importing the package stays cheap."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, table: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`, where `table` maps an exported name to the submodule
    (relative to the package) that defines it."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name in table:
            value = getattr(importlib.import_module(f".{table[name]}", package), name)
            namespace[name] = value  # later look-ups skip this function
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
