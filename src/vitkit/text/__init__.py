"""Text for CLIP models: the byte-level BPE tokenizer with the shipped 49,408-token vocabulary."""
from .tokenizer import CONTEXT_LENGTH, VOCAB_SIZE, ClipTokenizer, default_tokenizer, tokenize

__all__ = ["CONTEXT_LENGTH", "VOCAB_SIZE", "ClipTokenizer", "default_tokenizer", "tokenize"]
