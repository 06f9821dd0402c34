"""Shared fixtures: a real photo as model input, and a table of measured peer-parity differences.

Every test process runs torch on one thread: the test machines are small and shared, and one thread
keeps timings and reductions steady. Set here once, for the whole session, not per module."""
from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)
# the flag rules decide the fast paths in tests (and in the processes they start): a test that wants this
# machine measured says so (tests/test_measured_decisions.py)
os.environ["VITKIT_MEASURE"] = "0"

_PARITY: list[tuple[str, float, float]] = []


@pytest.fixture
def photo_batch():
    """make(size, mean, std) -> [3, 3, size, size]: skimage's astronaut photo resized, plus two random images."""
    from skimage import data

    def make(size: int, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)) -> torch.Tensor:
        img = torch.from_numpy(data.astronaut()).permute(2, 0, 1)[None].float() / 255  # [1, 3, 512, 512]
        img = torch.nn.functional.interpolate(img, size=(size, size), mode="bilinear", antialias=True)
        rand = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(0))
        x = torch.cat([img, rand])
        return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)

    return make


@pytest.fixture
def record_parity():
    """record(config, logits_diff, features_diff): collected for the end-of-run table."""
    def record(name: str, logits: float, feats: float) -> None:
        _PARITY.append((name, logits, feats))

    return record


def pytest_terminal_summary(terminalreporter):
    if _PARITY:
        terminalreporter.write_sep("-", "peer parity: max |diff| (fp32)")
        for name, lo, fe in _PARITY:
            terminalreporter.write_line(f"{name:58s} logits {lo:.2e}  features {fe:.2e}")
