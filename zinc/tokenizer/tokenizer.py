"""Text <-> token ids for a GGUF model, matching llama.cpp's `llama_tokenize` / `llama_token_to_piece`.

Owns: `Tokenizer` (built once per model from its GGUF metadata; immutable and thread-safe to share).
`encode(text, add_special, parse_special)` follows llama.cpp step by step: split off special
tokens, BPE each raw stretch (SentencePiece vocabularies escape spaces as `▁` and, when
`add_space_prefix` is set, put a space before text that starts the input or follows a special
token), then add BOS/EOS as the model asks. `decode` concatenates token pieces (the bytes each
token stands for) and reads them as UTF-8; control and unknown tokens are left out unless
`skip_special=False`, like llama.cpp's `special` flag. No clean-up of spaces is applied (neither
supported model asks for it), so `decode(encode(s)) == s`.
Memory: the `Vocab` object is dropped once built. Token text <-> id lookups go to the engine's
own vocabulary (the `tokenizers` model for gpt2, the file's token -> id map for SentencePiece),
and the pieces live in one bytes blob sliced by offset arrays (one small object per token would
cost ~2 MiB for a 49k vocabulary).
Imports: tokenizers (through backend), zinc.errors, the vocab/special/backend modules.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Mapping
from itertools import accumulate
from typing import Any

from zinc.errors import InvalidRequestError
from zinc.tokenizer.backend import build_backend, unknown_id
from zinc.tokenizer.special import SpecialSplitter
from zinc.tokenizer.vocab import CONTROL, SPM_SPACE, UNKNOWN, Vocab, load_vocab

_SURROGATES = re.compile("[\ud800-\udfff]")


def _offsets(pieces: list[bytes], hidden: bytes) -> tuple[array[int], array[int], array[int]]:
    """Start, end and end-when-hidden-tokens-are-skipped of every piece in `b"".join(pieces)`."""
    lengths = list(map(len, pieces))
    ends = array("I", accumulate(lengths))
    starts = array("I", accumulate(lengths, initial=0))
    starts.pop()
    ends_plain = array("I", ends)
    for hit in re.finditer(b"\x01", hidden):  # the few hidden tokens, found by a C-level scan
        ends_plain[hit.start()] = starts[hit.start()]
    return starts, ends, ends_plain


class Tokenizer:
    """A GGUF model's tokenizer. Build it with `Tokenizer.from_metadata(model.metadata)`."""

    def __init__(self, vocab: Vocab) -> None:
        self._backend = build_backend(vocab)
        self._splitter = SpecialSplitter(vocab)
        self._no_token = unknown_id(vocab)
        self._n = len(vocab.tokens)
        self._model, self._is_spm = vocab.model, vocab.is_spm
        self._special = vocab.special
        self._eog_ids = vocab.eog_ids
        self._add_bos, self._add_eos = vocab.add_bos, vocab.add_eos
        self._add_space_prefix = vocab.add_space_prefix
        self._bos_text = vocab.tokens[self.bos_id] if self.bos_id is not None else ""
        self._eos_text = vocab.tokens[self.eos_id] if self.eos_id is not None else ""
        # token i's piece is _blob[_starts[i]:_ends[i]]; _ends_plain[i] == _starts[i] for hidden tokens
        self._hidden = bytes(map((CONTROL, UNKNOWN).__contains__, vocab.kinds))
        self._blob = b"".join(vocab.pieces)
        self._starts, self._ends, self._ends_plain = _offsets(vocab.pieces, self._hidden)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (`tokenizer.ggml.*` keys); bad or unsupported vocabularies raise ZincError."""
        return cls(load_vocab(meta))

    # --- properties -------------------------------------------------------------------------
    @property
    def model(self) -> str:
        """`tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)."""
        return self._model

    @property
    def vocab_size(self) -> int:
        return self._n

    @property
    def bos_id(self) -> int | None:
        return self._special.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self._special.get("eos")

    @property
    def eot_id(self) -> int | None:
        return self._special.get("eot")

    @property
    def special_ids(self) -> dict[str, int]:
        """The vocabulary's special tokens by llama.cpp's names ("bos", "eos", "fim_pre", "fim_suf",
        "fim_mid", "fim_pad", "fim_rep", "fim_sep", ...); a token the model lacks is absent."""
        return dict(self._special)

    @property
    def eog_ids(self) -> frozenset[int]:
        """Every token that ends generation (EOS, end-of-turn, FIM pads, ...), as llama.cpp decides."""
        return self._eog_ids

    @property
    def add_bos(self) -> bool:
        return self._add_bos

    @property
    def add_eos(self) -> bool:
        return self._add_eos

    @property
    def add_space_prefix(self) -> bool:
        return self._add_space_prefix

    @property
    def bos_text(self) -> str:
        """The BOS token's text ("" when the model has none), for chat templates."""
        return self._bos_text

    @property
    def eos_text(self) -> str:
        return self._eos_text

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary (byte-level or `▁`-escaped for normal tokens)."""
        text = self._backend.id_to_token(self._check(token_id))
        assert text is not None  # every id below vocab_size is in the backend's vocabulary
        return text

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary text is exactly `text`, if any."""
        try:
            found = self._backend.token_to_id(text)
        except UnicodeEncodeError:  # lone surrogates: no token has them
            return None
        return found if found is not None and found < self._n else None  # not the gpt2 placeholder

    def is_special(self, token_id: int) -> bool:
        """True for control and unknown tokens: the ones `decode` leaves out by default."""
        return self._hidden[self._check(token_id)] != 0

    def is_eog(self, token_id: int) -> bool:
        return token_id in self._eog_ids

    def piece(self, token_id: int, *, skip_special: bool = True) -> bytes:
        """The bytes one token decodes to (possibly part of a UTF-8 character)."""
        if not 0 <= token_id < self._n:  # the check inline: this runs once per generated token
            self._check(token_id)
        ends = self._ends_plain if skip_special else self._ends
        return self._blob[self._starts[token_id] : ends[token_id]]

    # --- encode / decode --------------------------------------------------------------------
    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids for `text`, exactly as llama.cpp's `llama_tokenize(text, add_special, parse_special)`."""
        if _SURROGATES.search(text):  # lone surrogates cannot be UTF-8 encoded
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        out: list[int] = []
        if add_special and self._add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        backend = self._backend
        prev_special = True
        for part in self._splitter.split(text, parse_special=parse_special):
            if isinstance(part, int):
                out.append(part)
                prev_special = True
                continue
            if self._is_spm:
                if self._add_space_prefix and prev_special:
                    part = " " + part
                part = part.replace(" ", SPM_SPACE)
            ids = backend.encode(part)
            out.extend(ids if self._no_token not in ids else [i for i in ids if i != self._no_token])
            prev_special = False
        if add_special and self._add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = True) -> bytes:
        """The concatenated pieces of `ids` (may end inside a UTF-8 character)."""
        blob, starts, ends = self._blob, self._starts, self._ends_plain if skip_special else self._ends
        try:
            return b"".join([blob[starts[self._check(i)] : ends[i]] for i in ids])
        except TypeError as exc:
            raise InvalidRequestError(f"token ids must be integers ({exc})") from exc

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """The text of `ids`; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", "replace")

    def _check(self, token_id: int) -> int:
        if not 0 <= token_id < self._n:
            raise InvalidRequestError(
                f"token id {token_id} is out of range for a vocabulary of {self.vocab_size}"
            )
        return token_id
