"""The feature contract every family keeps (timm's): `feature_info` and `forward_intermediates`.

- `feature_info`: one dict per map the model can give, shallowest first: `num_chs` (channels), `reduction`
  (the map's stride in input pixels) and `module` (the submodule whose output it is), as timm's.
- `forward_intermediates(x, indices=None, *, norm=False, stop_early=False, output_fmt="NCHW",
  intermediates_only=False)`: the maps `indices` picks (`feature_take_indices`), in forward order, in
  `output_fmt` (every family gives "NCHW"; `output_fmts` lists what else it gives), with the final features
  (those of `forward_features`) unless `intermediates_only`.

Necks (the segmentation pyramid, `embed --feature patch`) read only these, never which family they hold.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigError
from ..layers.naflex import PatchBatch


def pooled_features(model, x):
    """`model.forward_head(model.forward_features(x), pre_logits=True)`: the pooled features the classifier sees
    [B, D], for any family; a PatchBatch's padding (layers/naflex.py) is left out of the pooling."""
    tokens = model.forward_features(x)
    if isinstance(x, PatchBatch):
        return model.forward_head(tokens, pre_logits=True, valid=x.token_mask(model.num_prefix_tokens))
    return model.forward_head(tokens, pre_logits=True)


def feature_take_indices(count: int, indices: int | Iterable[int] | None = None) -> tuple[list[int], int]:
    """Which of `count` maps to take: (absolute indices in forward order, each once; the largest).

    timm's rule (`timm.models._features.feature_take_indices`): None takes all, an int n the last n, a list
    those indices (negative ones count from the end). Out of range is one ConfigError line. Unlike timm's, the
    list comes back sorted and without repeats: the order in which the maps come out.
    """
    if indices is None:
        indices = count
    if isinstance(indices, bool) or isinstance(indices, str):  # bool is an int; a str is iterable
        raise ConfigError(f"feature indices must be an int (the last n) or a list of ints, got {indices!r}")
    if isinstance(indices, int):
        if not 0 < indices <= count:
            raise ConfigError(f"last-n feature count {indices} is out of range (1 to {count})")
        take = list(range(count - indices, count))
    else:
        indices = list(indices)
        if not indices:
            raise ConfigError("no feature indices given (an empty list): pass None for all maps")
        if any(isinstance(i, bool) or not isinstance(i, int) for i in indices):
            raise ConfigError(f"feature indices must be ints, got {indices!r}")
        bad = [i for i in indices if not -count <= i < count]
        if bad:
            raise ConfigError(f"feature indices {bad} are out of range for {count} maps (0 to {count - 1}, "
                              f"or -{count} to -1)")
        take = sorted({i % count for i in indices})
    return take, take[-1]


def check_output_fmt(output_fmt: str, supported: tuple[str, ...]) -> None:
    """Refuse, in one line, a layout the model does not give."""
    if output_fmt not in supported:
        raise ConfigError(f"output_fmt must be one of {', '.join(supported)} for this model, got {output_fmt!r}")
