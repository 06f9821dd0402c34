"""JSON round trip for the typed dataclass configs (model, preprocessing, recipes) saved with every
checkpoint and run: tuples become lists and back; unknown keys are refused, not silently dropped."""
from __future__ import annotations

import dataclasses
from typing import Any

from .errors import ConfigError


class JsonConfig:
    _what = "config"  # how an error names this kind of config
    _strict = True  # refuse unknown keys (False: ignore them, for metadata other tools may extend)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown and cls._strict:
            raise ConfigError(f"unknown {cls._what} field(s) {unknown}; known: {', '.join(sorted(known))}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in known})

