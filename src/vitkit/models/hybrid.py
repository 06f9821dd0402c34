"""Hybrid ViTs: patches from a CNN feature map (ResNetV2 / ResNet-D stems, small-image conv stems) (issue 11)."""
