"""CLIP's byte-level BPE tokenizer (Radford et al. 2021): the ids OpenAI's and open_clip's text towers were
trained on.

- Cleaning: `ftfy.fix_text`, HTML entities unescaped twice, whitespace runs collapsed to one space, then
  lower-cased (open_clip's default `clean='lower'`).
- Pre-tokenising: the special tokens, English contractions ('s 't 're 've 'm 'll 'd), runs of letters, single
  digits, runs of anything else but spaces (Unicode classes, hence the `regex` package).
- Each piece becomes UTF-8 bytes, each byte one printable character (so the merges never see spaces or control
  characters), and the last character carries `</w>`; the 48,894 merges of `bpe_simple_vocab_16e6.txt.gz`
  are applied lowest rank first.
- Vocabulary (49,408): 256 byte characters, the same with `</w>`, one entry per merge, `<start_of_text>`
  (49406), `<end_of_text>` (49407). A text is `[SOT] + ids + [EOT]`, padded with 0 to the context (77); a longer
  one is cut to the context and its last id replaced by EOT, so the tower still pools at an EOT.
"""
from __future__ import annotations

import gzip
import html
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import torch

from ..errors import ConfigError

VOCAB_FILE = Path(__file__).resolve().parents[1] / "assets" / "bpe_simple_vocab_16e6.txt.gz"
CONTEXT_LENGTH = 77
VOCAB_SIZE = 49408
NUM_MERGES = VOCAB_SIZE - 2 * 256 - 2  # 48,894: the merges file has more lines; CLIP uses the first ones
SOT, EOT = "<start_of_text>", "<end_of_text>"


def _require(module: str):
    """ftfy and regex come with the `clip` extra; without them, one line that says so."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"the CLIP tokenizer needs the {module!r} package, which is not installed: "
                          "pip install 'vitkit[clip]'") from None


def byte_symbols() -> dict[int, str]:
    """byte -> the character that stands for it. Printable Latin-1 bytes stand for themselves; the other 68
    (space, control characters, ...) get 256, 257, ... in byte order. The dict's order (printable first) is the
    order of the first 256 vocabulary entries."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    kept = set(printable)
    others = [b for b in range(256) if b not in kept]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}


class ClipTokenizer:
    """Text -> CLIP token ids. `tokenizer(["a photo of a cat."])` -> LongTensor [1, 77]."""

    def __init__(self, vocab_file: str | Path = VOCAB_FILE, context_length: int = CONTEXT_LENGTH):
        self._ftfy = _require("ftfy")
        regex = _require("regex")
        path = Path(vocab_file)
        try:
            lines = gzip.open(path, "rt", encoding="utf-8").read().split("\n")
        except (OSError, EOFError) as e:
            raise ConfigError(f"{path}: cannot read the BPE merges file ({type(e).__name__}: {e})") from None
        merges = [tuple(line.split()) for line in lines[1:1 + NUM_MERGES]]  # line 0 is a version header
        if len(merges) != NUM_MERGES or any(len(m) != 2 for m in merges):
            raise ConfigError(f"{path}: expected {NUM_MERGES} merge pairs after the header line")
        self.byte_to_char = byte_symbols()
        self.char_to_byte = {c: b for b, c in self.byte_to_char.items()}
        symbols = list(self.byte_to_char.values())
        vocab = symbols + [s + "</w>" for s in symbols] + [a + b for a, b in merges] + [SOT, EOT]
        self.encoder = {tok: i for i, tok in enumerate(vocab)}
        self.decoder = vocab
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.sot_id, self.eot_id = self.encoder[SOT], self.encoder[EOT]
        self.vocab_size = len(vocab)
        self.context_length = context_length
        self._pieces = regex.compile(
            rf"{SOT}|{EOT}|'s|'t|'re|'ve|'m|'ll|'d|[\p{{L}}]+|[\p{{N}}]|[^\s\p{{L}}\p{{N}}]+", regex.IGNORECASE)
        self._cache: dict[str, list[str]] = {SOT: [SOT], EOT: [EOT]}

    def clean(self, text: str) -> str:
        text = html.unescape(html.unescape(self._ftfy.fix_text(text)))
        return " ".join(text.split()).lower()

    def _bpe(self, piece: str) -> list[str]:
        """A piece (in byte characters) -> its vocabulary entries: repeatedly merge the adjacent pair with the
        lowest rank, every non-overlapping occurrence left to right, until no pair is a known merge."""
        if piece in self._cache:
            return self._cache[piece]
        parts = [*piece[:-1], piece[-1] + "</w>"]
        while len(parts) > 1:
            best = min(zip(parts, parts[1:]), key=lambda pair: self.ranks.get(pair, len(self.ranks)))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        if len(self._cache) < 100_000:  # bounded: a server tokenising arbitrary text must not grow forever
            self._cache[piece] = parts
        return parts

    def encode(self, text: str) -> list[int]:
        """Ids of a cleaned text, without SOT/EOT and without truncation."""
        if not isinstance(text, str):
            raise ConfigError(f"the CLIP tokenizer takes text, got {type(text).__name__}")
        ids: list[int] = []
        for piece in self._pieces.findall(self.clean(text)):
            chars = "".join(self.byte_to_char[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[tok] for tok in self._bpe(chars))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text, SOT and EOT left out (cut padding off first); `</w>` ends a word with a space."""
        ids = [int(i) for i in ids]
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ConfigError(f"token ids must be in 0..{self.vocab_size - 1}")
        chars = "".join(self.decoder[i] for i in ids if i not in (self.sot_id, self.eot_id))
        chars = chars.replace("</w>", self.byte_to_char[ord(" ")])
        return bytes(self.char_to_byte[c] for c in chars).decode("utf-8", errors="replace").strip()

    def __call__(self, texts: str | Sequence[str], context_length: int | None = None) -> torch.Tensor:
        """[N, context] int64: SOT, the ids, EOT, zeros; over-long texts cut with EOT kept last."""
        if isinstance(texts, str):
            texts = [texts]
        n_ctx = context_length or self.context_length
        if n_ctx < 2:
            raise ConfigError(f"context_length must be at least 2 (start and end of text), got {n_ctx}")
        out = torch.zeros(len(texts), n_ctx, dtype=torch.long)
        for row, text in enumerate(texts):
            ids = [self.sot_id, *self.encode(text)][: n_ctx - 1] + [self.eot_id]
            out[row, : len(ids)] = torch.tensor(ids)
        return out


@lru_cache(maxsize=1)
def default_tokenizer() -> ClipTokenizer:
    """The shipped vocabulary, read once per process (about a second)."""
    return ClipTokenizer()


def tokenize(texts: str | Sequence[str], context_length: int = CONTEXT_LENGTH) -> torch.Tensor:
    """open_clip.tokenize's equivalent: [N, context_length] int64 ids."""
    return default_tokenizer()(texts, context_length)
