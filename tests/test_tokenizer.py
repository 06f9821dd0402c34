"""vitkit's CLIP tokenizer against open_clip's: the same ids, from the vocabulary file vitkit ships."""
from __future__ import annotations

import gzip

import pytest
import torch
from open_clip.tokenizer import SimpleTokenizer

from vitkit.errors import ConfigError
from vitkit.text import CONTEXT_LENGTH, VOCAB_SIZE, ClipTokenizer, default_tokenizer, tokenize
from vitkit.text.tokenizer import VOCAB_FILE

TEXTS = [
    "a photo of a cat.", "", "   \t\n ", "A PHOTO OF A DOG", "Hello, World!!! It's 3.14 o'clock; we'll see...",
    "don't WON'T I'M YOU'LL they'd've", "Ünïcödé façade — naïve café", "東京 日本語のテキスト 한국어 русский текст",
    "emoji 🐱🐶👍🏽 👨‍👩‍👧 flags 🇫🇷", "&amp;lt;b&amp;gt; html &quot;quoted&quot; &#39;x&#39;",
    "ftfy fixes mojibake: â€œquotedâ€\x9d", "ﬁ ligature, Ａ full width, e\u0301 combining", "tabs\tand\nnewlines  and   spaces",
    "12345 6789 3.14159 1e-5 #hashtag @user", "Ω≈ç√∫˜µ≤≥÷ ¡™£¢∞§¶•ªº–≠", "\x00\x01\x7f control bytes",
    "<start_of_text> special <end_of_text> tokens in text", "a" * 300, " ".join(["word"] * 100),
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "snake_case camelCase kebab-case dot.case path/to/file.png https://example.com/?q=1&x=2",
]


@pytest.fixture(scope="module")
def peer():
    return SimpleTokenizer()


def test_ids_equal_open_clip(peer):
    ours = default_tokenizer()
    assert ours.vocab_size == VOCAB_SIZE == peer.vocab_size == 49408
    assert (ours.sot_id, ours.eot_id) == (peer.sot_token_id, peer.eot_token_id) == (49406, 49407)
    mine, theirs = tokenize(TEXTS), peer(TEXTS)
    assert mine.shape == (len(TEXTS), CONTEXT_LENGTH) and mine.dtype == torch.long
    assert torch.equal(mine, theirs)
    for text in TEXTS:  # untruncated ids too, and the same vocabulary strings
        assert ours.encode(text) == peer.encode(text), text
    assert ours.decoder == [peer.decoder[i] for i in range(VOCAB_SIZE)]
    for n in (5, 16, 200):  # other context lengths
        assert torch.equal(tokenize(TEXTS, n), peer(TEXTS, context_length=n))


def test_layout_of_a_row():
    ids = tokenize(["a photo of a cat.", "", "x " * 200])
    assert ids[1, :2].tolist() == [49406, 49407] and not ids[1, 2:].any()  # empty: SOT, EOT, zeros
    assert ids[0, 0] == 49406 and ids[0].argmax() == (ids[0] != 0).sum() - 1  # EOT last and the largest id
    assert (ids[2] != 0).all() and ids[2, -1] == 49407  # over-long: cut, EOT kept in the last place
    tok = default_tokenizer()
    assert tok.decode(tok.encode("A Photo   of a CAT!")) == "a photo of a cat !"


def test_bad_input_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="takes text"):
        tokenize([b"bytes"])
    with pytest.raises(ConfigError, match="at least 2"):
        tokenize("x", context_length=1)
    with pytest.raises(ConfigError, match="0..49407"):
        default_tokenizer().decode([49408])
    bad = tmp_path / "merges.txt.gz"
    with gzip.open(bad, "wt") as f:
        f.write("#version\na b\n")
    with pytest.raises(ConfigError, match="merge pairs"):
        ClipTokenizer(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        ClipTokenizer(tmp_path / "missing.txt.gz")


def test_the_vocabulary_ships_with_its_license():
    assert VOCAB_FILE.is_file() and VOCAB_FILE.stat().st_size == 1_356_917
    notice = VOCAB_FILE.with_name("bpe_simple_vocab_16e6.LICENSE").read_text()
    assert "MIT License" in notice and "Copyright (c) 2021 OpenAI" in notice
