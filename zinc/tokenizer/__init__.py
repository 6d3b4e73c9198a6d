"""Tokenization for zinc: GGUF vocabularies, streaming detokenization and chat templates.

Owns the public API of the package: `Tokenizer` (llama.cpp-exact encode/decode from GGUF metadata),
`IncrementalDecoder` (text deltas that never split a character) and `ChatTemplate` (sandboxed
jinja2 chat templates with documented fallbacks).
Imports: its own modules; they import tokenizers, jinja2 and zinc.errors.
"""

from zinc.tokenizer.chat import ChatTemplate, normalize_messages
from zinc.tokenizer.detokenizer import IncrementalDecoder
from zinc.tokenizer.tokenizer import Tokenizer

__all__ = ["ChatTemplate", "IncrementalDecoder", "Tokenizer", "normalize_messages"]
