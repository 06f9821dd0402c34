"""The bits of nn.Module that predict and eval touch (`eval()`, `train()`, `to()`), for callables that only run
inference: the ONNX and OpenVINO runners and `vitkit.runner`. One definition instead of one per runtime."""
from __future__ import annotations

from ..errors import ConfigError


class InferenceOnly:
    """`train(True)` raises `train_error(untrainable)`; `eval()`, `train(False)` and `to(...)` return self."""

    training = False
    untrainable = "this model cannot be trained"
    train_error: type[Exception] = ConfigError

    def eval(self):
        return self

    def train(self, mode: bool = True):
        if mode:
            raise self.train_error(self.untrainable)
        return self

    def to(self, *args, **kwargs):
        return self
