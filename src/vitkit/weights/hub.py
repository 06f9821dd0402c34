"""`pretrained=True`: timm-format weights on the Hugging Face hub, through huggingface_hub's cache."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import CheckpointError, ConfigError, OfflineError

# the local alternative to hub weights, for Python callers and command-line users alike: every command that
# takes a checkpoint takes a file path where it takes a pretrained name
LOCAL_WEIGHTS_HINT = ("use a local weights file (.safetensors/.pth/.bin/.npz or an HF folder): checkpoint_path=PATH "
                      "in Python, or its path in place of the name on the command line (vitkit predict FILE IMAGE ...)")


def hub_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:
        return os.path.expanduser("~/.cache/huggingface/hub")


def _is_transport_error(e: BaseException) -> bool:
    """The request never got an answer: no network, DNS failure, refused connection, timeout.

    huggingface_hub has used requests, httpx and httpx2 across versions; their transport errors share
    these class names, so they are matched by name rather than imported."""
    names = {c.__name__ for c in type(e).__mro__}
    return isinstance(e, (ConnectionError, TimeoutError)) or bool(
        names & {"TransportError", "ConnectionError", "ConnectError", "Timeout", "TimeoutException"}
    )


def _classify(e: BaseException, repo_id: str, filename: str) -> Exception | None:
    """A hub failure as a vitkit error: the repo/tag/file does not exist, or the hub cannot be reached.
    None when it is neither (the caller decides)."""
    from huggingface_hub import utils as hfu

    where = f"the cache at {hub_cache_dir()}"
    local = LOCAL_WEIGHTS_HINT
    if isinstance(e, (hfu.LocalEntryNotFoundError, getattr(hfu, "OfflineModeIsEnabled", ()))) or _is_transport_error(e):
        return OfflineError(
            f"could not get {repo_id}/{filename}: it is not in {where} and the hub is not reachable "
            f"({type(e).__name__}). Download it where there is a network (same cache layout) or {local}"
        )
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, hfu.EntryNotFoundError):  # after LocalEntryNotFoundError, its subclass in new versions
        return CheckpointError(f"hub repo {repo_id} has no file {filename} (HTTP {status or 404}): "
                               f"those weights do not exist; pick another tag (`vitkit models`) or {local}")
    if isinstance(e, (hfu.RepositoryNotFoundError, hfu.RevisionNotFoundError, hfu.GatedRepoError)) or status == 404:
        return CheckpointError(
            f"hub repo {repo_id} does not exist ({type(e).__name__}, HTTP {status or 404}): no such repo or tag "
            f"(or it is private/gated); pick another tag (`vitkit models`) or {local}"
        )
    if isinstance(e, hfu.HfHubHTTPError):
        return OfflineError(f"the hub answered HTTP {status} for {repo_id}/{filename} and it is not in {where}; "
                            f"try again later or {local}")
    return None


def download_weights(repo_id: str, filename: str = "model.safetensors") -> Path:
    """Path of `filename` from hub repo `repo_id`, from the cache when present.

    - In the cache: returned without touching the network.
    - Not cached and offline (HF_HUB_OFFLINE=1, no network, hub unreachable): an OfflineError naming the
      cache and the local-file alternative (`LOCAL_WEIGHTS_HINT`), after at most one request (huggingface_hub's own
      download retries an unreachable hub five times with backoff, so one HEAD request is made first).
    - The hub answers that the repo, tag or file does not exist: a CheckpointError naming the repo.
    """
    try:
        from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
        from huggingface_hub import utils as hfu
    except ImportError:
        raise OfflineError(f"pretrained=True needs huggingface_hub: pip install 'vitkit[hub]'; or "
                           f"{LOCAL_WEIGHTS_HINT}") from None
    try:
        return Path(hf_hub_download(repo_id, filename, local_files_only=True))
    except hfu.LocalEntryNotFoundError:
        pass  # not cached
    except Exception as e:  # a broken cache entry or a hub error: report it as such
        raise (_classify(e, repo_id, filename) or CheckpointError(
            f"could not read {repo_id}/{filename} from the cache at {hub_cache_dir()}: {type(e).__name__}")) from None
    if constants.HF_HUB_OFFLINE:
        raise OfflineError(
            f"could not get {repo_id}/{filename}: it is not in the cache at {hub_cache_dir()} and "
            "HF_HUB_OFFLINE=1 forbids downloading. Download it where there is a network (same cache layout) "
            f"or {LOCAL_WEIGHTS_HINT}"
        )
    try:  # one request, no retries: tells "unreachable" and "does not exist" apart quickly
        get_hf_file_metadata(hf_hub_url(repo_id, filename), timeout=5)
    except Exception as e:  # classified below; anything else is left to the download
        err = _classify(e, repo_id, filename)
        if err is not None:
            raise err from None
    try:
        return Path(hf_hub_download(repo_id, filename, etag_timeout=5))
    except Exception as e:  # the hub raises many types
        err = _classify(e, repo_id, filename)
        raise (err or CheckpointError(f"could not download {repo_id}/{filename}: {type(e).__name__}: "
                                      f"{str(e).splitlines()[0] if str(e) else ''}")) from None


def resolve_pretrained(name: str, hub: dict[str, str]) -> str:
    """'vit_base_patch16_224.augreg_in21k_ft_in1k' or a bare name (first known tag) -> hub repo id."""
    base, _, tag = name.partition(".")
    if not hub:
        raise ConfigError(f"no pretrained weights are registered for {base}; {LOCAL_WEIGHTS_HINT}")
    if tag:
        if tag not in hub:
            raise ConfigError(f"{base} has no pretrained tag {tag!r}; known: {', '.join(hub)}")
        return hub[tag]
    return next(iter(hub.values()))
