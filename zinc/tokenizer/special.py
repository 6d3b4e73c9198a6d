"""Splitting text around special tokens before BPE, as llama.cpp's `tokenizer_st_partition` does.

Owns: `SpecialSplitter`. Special tokens are the control, unknown and user-defined ones. They are
tried longest text first (ties by id); each one splits every remaining raw stretch at all its
non-overlapping occurrences, left to right. Without `parse_special` only user-defined tokens are
matched (Gemma's `<s>` and its whitespace-run tokens, for example); control and unknown tokens are
then left to BPE like any other text. LSTRIP/RSTRIP attributes (a few BERT/Phi-3 models) are not
modelled. To stay fast with thousands of special tokens, a token is only tried when its first
characters occur in the text.
Imports: zinc.tokenizer.vocab.
"""

from __future__ import annotations

from itertools import compress

from zinc.tokenizer.vocab import CONTROL, UNKNOWN, USER_DEFINED, Vocab

_KEY_LEN = 3


class SpecialSplitter:
    def __init__(self, vocab: Vocab) -> None:
        wanted = (CONTROL, UNKNOWN, USER_DEFINED)
        chosen = list(compress(range(len(vocab.kinds)), map(wanted.__contains__, vocab.kinds)))
        chosen.sort(key=lambda i: (-len(vocab.tokens[i]), i))
        self._order = {tok: rank for rank, tok in enumerate(chosen)}
        self._text = {i: vocab.tokens[i] for i in chosen}
        # first characters -> tokens, separately for the always-matched (user-defined) ones
        self._always: dict[str, list[int]] = {}
        self._parse_only: dict[str, list[int]] = {}
        for i in chosen:
            table = self._always if vocab.kinds[i] == USER_DEFINED else self._parse_only
            table.setdefault(vocab.tokens[i][:_KEY_LEN], []).append(i)

    def _candidates(self, text: str, parse_special: bool) -> list[int]:
        found: list[int] = []
        tables = (self._always, self._parse_only) if parse_special else (self._always,)
        for table in tables:
            for key, toks in table.items():
                if key in text:
                    found.extend(t for t in toks if self._text[t] in text)
        found.sort(key=self._order.__getitem__)
        return found

    def split(self, text: str, *, parse_special: bool) -> list[str | int]:
        """`text` as raw stretches (str) and special token ids (int), in order; no empty stretches."""
        if not text:
            return []
        parts: list[str | int] = [text]
        for tok in self._candidates(text, parse_special):
            needle = self._text[tok]
            out: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or needle not in part:
                    out.append(part)
                    continue
                for k, piece in enumerate(part.split(needle)):  # non-overlapping, left to right
                    if k:
                        out.append(tok)
                    if piece:
                        out.append(piece)
            parts = out
        return parts
