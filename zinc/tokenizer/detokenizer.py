"""Streaming detokenization: token ids in, text deltas out, never half a character.

Owns: `IncrementalDecoder`. A token can stand for part of a UTF-8 character (SentencePiece byte
fallback `<0xNN>` tokens, byte-level BPE pieces that cut an emoji); those bytes are held until the
character is complete. Invalid bytes become U+FFFD as soon as they are known to be invalid, and
`flush()` turns a dangling incomplete sequence into U+FFFD, so the joined deltas always equal
`Tokenizer.decode(all ids)`.
Imports: zinc.tokenizer.tokenizer (for the token pieces).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from zinc.tokenizer.tokenizer import Tokenizer


class IncrementalDecoder:
    """Feed ids one at a time with `add`; each call returns the text that became complete."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._count = 0

    @property
    def tokens_seen(self) -> int:
        return self._count

    @property
    def pending_bytes(self) -> int:
        """Bytes held back because they may be the start of a character not yet complete."""
        buffered, _ = self._utf8.getstate()
        return len(buffered)

    def add(self, token_id: int) -> str:
        """The new text after `token_id` ("" while a character is incomplete or the token is hidden)."""
        self._count += 1
        return self._utf8.decode(self._tokenizer.piece(token_id, skip_special=self._skip_special))

    def add_many(self, token_ids: Iterable[int]) -> str:
        """Like calling `add` for each id, joined."""
        ids = list(token_ids)
        self._count += len(ids)
        return self._utf8.decode(self._tokenizer.decode_bytes(ids, skip_special=self._skip_special))

    def flush(self) -> str:
        """Whatever is still held, as text (incomplete bytes become U+FFFD); the decoder is then reset."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
