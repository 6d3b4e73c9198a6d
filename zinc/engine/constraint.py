"""Constrained decoding per token: an llguidance matcher over a model's vocabulary.

Owns: `GrammarMatcher` — one request's grammar state. Each step it gives the boolean mask of the
tokens the grammar allows next (the sampler applies it to the step's logits on the host, greedy
included), is told the token that was chosen, and says when the grammar is complete. The
llguidance tokenizer is built from zinc's own `Tokenizer` (the byte piece of every token, the
control tokens as special, zinc's BPE as the tokenize callback) once per tokenizer and cached.
Imports: llguidance (where a grammar is first built), numpy, zinc.engine.types, zinc.tokenizer,
zinc.errors.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from zinc.engine.types import Grammar
from zinc.errors import InvalidRequestError
from zinc.tokenizer import Tokenizer

if TYPE_CHECKING:  # imported where first used: most starts serve no grammar (llguidance: ~40 ms)
    from llguidance import LLMatcher, LLTokenizer

BoolArray = np.ndarray[Any, np.dtype[np.bool_]]


class _TokenizerView:
    """What llguidance's `TokenizerWrapper` reads: token bytes, special ids, EOS, and an encoder."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        n = tokenizer.vocab_size
        self.eos_token_id = (
            tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids, default=0)
        )
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [tokenizer.piece(i, skip_special=False) for i in range(n)]
        self.special_token_ids = [i for i in range(n) if tokenizer.is_special(i)]
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("text only")  # llguidance then passes str
        return self._tokenizer.encode(text, add_special=False, parse_special=False)


_CACHE: weakref.WeakKeyDictionary[Tokenizer, LLTokenizer] = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def ll_tokenizer(tokenizer: Tokenizer) -> LLTokenizer:
    """llguidance's view of `tokenizer` (about 0.3 s to build for a 49k vocabulary; cached)."""
    with _CACHE_LOCK:
        found = _CACHE.get(tokenizer)
        if found is None:
            from llguidance import LLTokenizer, TokenizerWrapper

            eog = sorted(tokenizer.eog_ids) or None
            found = LLTokenizer(
                TokenizerWrapper(_TokenizerView(tokenizer)), n_vocab=tokenizer.vocab_size, eos_token=eog
            )
            _CACHE[tokenizer] = found
        return found


class GrammarMatcher:
    """One generation's grammar state; `allowed()` -> sample -> `accept(token)` each step."""

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer) -> None:
        from llguidance import LLMatcher

        self._vocab = tokenizer.vocab_size
        self._matcher: LLMatcher = LLMatcher(ll_tokenizer(tokenizer), grammar.source, log_level=0)
        if self._matcher.is_error():
            raise InvalidRequestError(f"the {grammar.kind} constraint cannot be used: {self._error()}")

    def _error(self) -> str:
        return " ".join(self._matcher.get_error().split())[:300]

    def allowed(self) -> BoolArray:
        """The tokens the grammar allows next (the vocabulary's size; True = allowed)."""
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        mask: BoolArray = np.unpackbits(bits, bitorder="little")[: self._vocab].astype(np.bool_)
        return mask

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise RuntimeError(f"the constraint refused token {token}: {self._error()}")

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing but end of generation may follow."""
        return self._matcher.is_stopped()
