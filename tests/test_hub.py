"""pretrained=True goes through huggingface_hub's cache: offline without the files is one clear error;
offline with the files (hub cache layout) loads timm's weights; a hub that answers "no such repo/tag/file"
gives a different error from a hub that cannot be reached.

No hub is reachable from the tests. The server's answers are played by a local HTTP server on 127.0.0.1
(HF_ENDPOINT points huggingface_hub at it), so the library's own request and error-mapping code runs."""
from __future__ import annotations

import http.server
import os
import socket
import threading

import pytest
import torch
from safetensors.torch import save_file

import vitkit

REPO = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"


def _pretrained_in_fresh_python(fresh_python, tmp_path, **env_vars) -> tuple[str, str]:
    """huggingface_hub reads HF_HUB_OFFLINE / HF_HUB_CACHE / HF_ENDPOINT at import time: run in a fresh
    interpreter (conftest's fresh_python) with an empty cache. Returns ('<ErrorClass>: <message>', stderr)."""
    cache = tmp_path / "hub-cache"
    cache.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= dict(HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "home"), HF_HUB_DISABLE_TELEMETRY="1") | env_vars
    code = ("import vitkit\n"
            "try:\n    vitkit.create_model('vit_tiny_patch16_224', pretrained=True)\n"
            "except vitkit.VitkitError as e:\n    print(f'{type(e).__name__}: {e}')\n")
    res = fresh_python.run(code, env=env, timeout=180)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip(), res.stderr


def test_offline_empty_cache_is_a_clear_error(fresh_python, tmp_path):
    msg, err = _pretrained_in_fresh_python(fresh_python, tmp_path, HF_HUB_OFFLINE="1")
    assert msg.startswith("OfflineError:") and "\n" not in msg
    assert str(tmp_path / "hub-cache") in msg and "checkpoint_path" in msg and REPO in msg
    assert "HF_HUB_OFFLINE" in msg and "Retrying" not in err


def test_unresponsive_hub_fails_after_one_request(fresh_python, tmp_path):
    """A hub that accepts connections but never answers (a stalled network or proxy): OfflineError after one
    attempt and its timeout, not after huggingface_hub's five retries with backoff. The listening socket
    counts the attempts."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []

    def accept_and_stall():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)  # never answered

    threading.Thread(target=accept_and_stall, daemon=True).start()
    try:
        msg, err = _pretrained_in_fresh_python(fresh_python, tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{srv.getsockname()[1]}")
    finally:
        srv.close()
        for conn in held:
            conn.close()
    assert msg.startswith("OfflineError:") and "\n" not in msg, msg
    assert "not reachable" in msg and REPO in msg and "checkpoint_path" in msg
    assert len(held) == 1 and "Retrying" not in err


def test_refused_connection_is_offline(fresh_python, tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    msg, err = _pretrained_in_fresh_python(fresh_python, tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{port}")
    assert msg.startswith("OfflineError:") and "not reachable" in msg and REPO in msg
    assert "Retrying" not in err


class _HubSays404(http.server.BaseHTTPRequestHandler):
    """Answers every request as the hub answers a missing repo/revision/file: 404 + X-Error-Code."""
    error_code = ""

    def _answer(self):
        self.send_response(404)
        if self.error_code:
            self.send_header("X-Error-Code", self.error_code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET = _answer

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("error_code", ["RepoNotFound", "RevisionNotFound", "EntryNotFound", ""])
def test_hub_not_found_is_not_offline(fresh_python, tmp_path, error_code):
    """The hub is reachable and says the repo (or tag, or file) does not exist: a CheckpointError naming the
    repo, never the "not reachable / download it elsewhere" advice. huggingface_hub turns these answers into
    RepositoryNotFoundError / RevisionNotFoundError / (Remote)EntryNotFoundError / a plain 404 HfHubHTTPError."""
    handler = type("Handler", (_HubSays404,), {"error_code": error_code})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        msg, _ = _pretrained_in_fresh_python(fresh_python, tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert msg.startswith("CheckpointError:") and "\n" not in msg, msg
    assert REPO in msg and ("does not exist" in msg or "has no file" in msg) and "404" in msg
    assert "not reachable" not in msg and "checkpoint_path" in msg


def test_pretrained_from_local_hub_cache(tmp_path, monkeypatch, photo_batch, record_parity):
    import timm
    from huggingface_hub import constants

    peer = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in peer.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = tmp_path / ("models--" + REPO.replace("/", "--"))
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True)
    save_file(peer.state_dict(), str(snap / "model.safetensors"))
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    vk = vitkit.create_model("vit_tiny_patch16_224", pretrained=True).eval()
    assert vk.provenance["source"] == f"hub:{REPO}"
    x = photo_batch(224)
    with torch.no_grad():
        ref_logits, ref_feats = peer(x), peer.forward_head(peer.forward_features(x), pre_logits=True)
        lo = (vk(x) - ref_logits).abs().max().item()
        fe = (vk.forward_head(vk.forward_features(x), pre_logits=True) - ref_feats).abs().max().item()
    record_parity("hub cache vit_tiny_patch16_224 pretrained=True", lo, fe)
    assert lo <= 1e-4 and fe <= 1e-4


# the local alternative, named for both audiences: the Python keyword and what the command line accepts
PYTHON_WAY, CLI_WAY = "checkpoint_path=PATH in Python", "vitkit predict FILE IMAGE"


def test_offline_pretrained_name_on_the_command_line_names_the_cli_way(fresh_python, tmp_path):
    """`vitkit predict NAME IMG` offline: one stderr line that says how to pass a local file on the command
    line too, and that way works: the same command with a file path in place of the name predicts."""
    from PIL import Image

    image = tmp_path / "gray.png"
    Image.new("RGB", (64, 64), (128, 128, 128)).save(image)
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= dict(HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    res = fresh_python.run(module="vitkit", args=["predict", "vit_tiny_patch16_224", str(image)], env=env, timeout=180)
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert REPO in res.stderr and PYTHON_WAY in res.stderr and CLI_WAY in res.stderr
    assert "checkpoint_path=/path" not in res.stderr
    local = vitkit.save_model(vitkit.create_model("vit_tiny_patch16_224", depth=1, embed_dim=32, num_heads=2,
                                                  num_classes=2), tmp_path / "local.safetensors")
    res = fresh_python.run(module="vitkit", args=["predict", str(local), str(image), "--json"], env=env, timeout=180)
    assert res.returncode == 0, res.stderr


def test_no_registered_weights_names_both_ways():
    from vitkit.weights.hub import resolve_pretrained

    with pytest.raises(vitkit.ConfigError) as e:
        vitkit.create_model("vit_pico_patch2_8", pretrained=True)
    assert "vit_pico_patch2_8" in str(e.value) and PYTHON_WAY in str(e.value) and CLI_WAY in str(e.value)
    with pytest.raises(vitkit.ConfigError) as e:
        resolve_pretrained("vit_pico_patch2_8", {})
    assert PYTHON_WAY in str(e.value) and CLI_WAY in str(e.value)
