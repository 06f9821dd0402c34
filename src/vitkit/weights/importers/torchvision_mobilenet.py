"""torchvision's MobileNetV3 checkpoints (`torchvision.models.mobilenet_v3_small/large` state dicts): vitkit's
`mobilenet` family keeps torchvision's key names, so the filter is the identity; the architecture is read off
the shapes: small or large from the number of `features` entries (13 / 17), the width from the stem, the
channels from the stem conv, the classes from `classifier.3`."""
from __future__ import annotations

import re

from ...errors import CheckpointError
from ...models.mobilenet import MobileNetConfig
from ..layouts import Imported, StateDict, layout

_ENTRIES = {13: ("mobilenet_v3_small", 16), 17: ("mobilenet_v3_large", 16)}  # features entries -> (arch, stem width)


def _is_mobilenet_v3(sd: StateDict) -> bool:
    return "features.0.0.weight" in sd and "classifier.3.weight" in sd and "features.1.block.0.0.weight" in sd


@layout("torchvision-mobilenet-v3", _is_mobilenet_v3, priority=10, family="mobilenet")
def convert_mobilenet_v3(sd: StateDict, hf_config=None) -> Imported:
    entries = 1 + max(int(m.group(1)) for k in sd if (m := re.match(r"features\.(\d+)\.", k)))
    if entries not in _ENTRIES:
        raise CheckpointError(f"a MobileNetV3 has 13 (small) or 17 (large) feature stages, this file {entries}")
    arch, stem = _ENTRIES[entries]
    w = sd["features.0.0.weight"]  # [stem width, C, 3, 3]
    cfg = MobileNetConfig(arch=arch, in_chans=int(w.shape[1]), num_classes=int(sd["classifier.3.weight"].shape[0]),
                          width_mult=int(w.shape[0]) / stem)
    return Imported(dict(sd), "torchvision-mobilenet-v3", {}, [], None, None, family="mobilenet", config=cfg)
