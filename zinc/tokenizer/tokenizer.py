"""Text <-> token ids for a GGUF model, matching llama.cpp's `llama_tokenize` / `llama_token_to_piece`.

Owns: `Tokenizer` (built once per model from its GGUF metadata; immutable and thread-safe to share).
`encode(text, add_special, parse_special)` follows llama.cpp step by step: split off special
tokens, BPE each raw stretch (SentencePiece vocabularies escape spaces as `▁` and, when
`add_space_prefix` is set, put a space before text that starts the input or follows a special
token), then add BOS/EOS as the model asks. `decode` concatenates token pieces (the bytes each
token stands for) and reads them as UTF-8; control and unknown tokens are left out unless
`skip_special=False`, like llama.cpp's `special` flag. No clean-up of spaces is applied (neither
supported model asks for it), so `decode(encode(s)) == s`.
Imports: tokenizers (through backend), zinc.errors, the vocab/special/backend modules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from zinc.errors import InvalidRequestError
from zinc.tokenizer.backend import build_backend, unknown_id
from zinc.tokenizer.special import SpecialSplitter
from zinc.tokenizer.vocab import CONTROL, SPM_SPACE, UNKNOWN, Vocab, load_vocab

_SURROGATES = re.compile("[\ud800-\udfff]")


class Tokenizer:
    """A GGUF model's tokenizer. Build it with `Tokenizer.from_metadata(model.metadata)`."""

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._backend = build_backend(vocab)
        self._splitter = SpecialSplitter(vocab)
        self._no_token = unknown_id(vocab)
        hidden = [k in (CONTROL, UNKNOWN) for k in vocab.kinds]
        self._hidden = hidden
        self._pieces_shown = vocab.pieces
        self._pieces_plain = [b"" if h else p for p, h in zip(vocab.pieces, hidden, strict=True)]

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (`tokenizer.ggml.*` keys); bad or unsupported vocabularies raise ZincError."""
        return cls(load_vocab(meta))

    # --- properties -------------------------------------------------------------------------
    @property
    def model(self) -> str:
        """`tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)."""
        return self._vocab.model

    @property
    def vocab_size(self) -> int:
        return len(self._vocab.tokens)

    @property
    def bos_id(self) -> int | None:
        return self._vocab.special.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self._vocab.special.get("eos")

    @property
    def eot_id(self) -> int | None:
        return self._vocab.special.get("eot")

    @property
    def eog_ids(self) -> frozenset[int]:
        """Every token that ends generation (EOS, end-of-turn, FIM pads, ...), as llama.cpp decides."""
        return self._vocab.eog_ids

    @property
    def add_bos(self) -> bool:
        return self._vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self._vocab.add_eos

    @property
    def add_space_prefix(self) -> bool:
        return self._vocab.add_space_prefix

    @property
    def bos_text(self) -> str:
        """The BOS token's text ("" when the model has none), for chat templates."""
        return self._vocab.tokens[self.bos_id] if self.bos_id is not None else ""

    @property
    def eos_text(self) -> str:
        return self._vocab.tokens[self.eos_id] if self.eos_id is not None else ""

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary (byte-level or `▁`-escaped for normal tokens)."""
        return self._vocab.tokens[self._check(token_id)]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary text is exactly `text`, if any."""
        return self._vocab.ids.get(text)

    def is_special(self, token_id: int) -> bool:
        """True for control and unknown tokens: the ones `decode` leaves out by default."""
        return self._hidden[self._check(token_id)]

    def is_eog(self, token_id: int) -> bool:
        return token_id in self._vocab.eog_ids

    def piece(self, token_id: int, *, skip_special: bool = True) -> bytes:
        """The bytes one token decodes to (possibly part of a UTF-8 character)."""
        pieces = self._pieces_plain if skip_special else self._pieces_shown
        return pieces[self._check(token_id)]

    # --- encode / decode --------------------------------------------------------------------
    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids for `text`, exactly as llama.cpp's `llama_tokenize(text, add_special, parse_special)`."""
        if _SURROGATES.search(text):  # lone surrogates cannot be UTF-8 encoded
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        vocab = self._vocab
        out: list[int] = []
        if add_special and vocab.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        backend = self._backend
        prev_special = True
        for part in self._splitter.split(text, parse_special=parse_special):
            if isinstance(part, int):
                out.append(part)
                prev_special = True
                continue
            if vocab.is_spm:
                if vocab.add_space_prefix and prev_special:
                    part = " " + part
                part = part.replace(" ", SPM_SPACE)
            ids = backend.encode(part, add_special_tokens=False).ids
            out.extend(ids if self._no_token not in ids else [i for i in ids if i != self._no_token])
            prev_special = False
        if add_special and vocab.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = True) -> bytes:
        """The concatenated pieces of `ids` (may end inside a UTF-8 character)."""
        pieces = self._pieces_plain if skip_special else self._pieces_shown
        try:
            return b"".join([pieces[self._check(i)] for i in ids])
        except TypeError as exc:
            raise InvalidRequestError(f"token ids must be integers ({exc})") from exc

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """The text of `ids`; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", "replace")

    def _check(self, token_id: int) -> int:
        if not 0 <= token_id < len(self._vocab.tokens):
            raise InvalidRequestError(
                f"token id {token_id} is out of range for a vocabulary of {self.vocab_size}"
            )
        return token_id
