"""Errors a user can act on. The CLI prints these as one line and exits non-zero, never a traceback."""


class VitkitError(Exception):
    """Base class: a problem with the user's input, files or request (not a bug in vitkit)."""


class ConfigError(VitkitError, ValueError):
    """An impossible model or run configuration (unknown model, bad image size, ...)."""


class CheckpointError(VitkitError):
    """A checkpoint that cannot be read, is unsafe to read, or does not fit the model."""


class ImageError(VitkitError):
    """An image file that cannot be decoded or is refused (corrupt, truncated, too large)."""


class DataError(VitkitError):
    """A dataset that is missing, empty or inconsistent."""


class OfflineError(VitkitError):
    """Something had to be downloaded but the network or hub is not reachable."""
