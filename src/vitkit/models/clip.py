"""CLIP: the vision tower (a VisionTransformer) and the text tower in one model (filled in by issue 13)."""
