"""SentencePiece-BPE tokenization from the vocabulary's scores, as llama.cpp's `llm_tokenizer_spm`.

Owns: `SpmEngine` — text (spaces already escaped as `▁`) to ids for `llama` vocabularies (Gemma).
Every character starts as a symbol; the adjacent pair whose concatenation is a token with the
highest score (leftmost on ties) is joined, again and again; a symbol left over that is no token
is spelled as its UTF-8 bytes' `<0xNN>` tokens (or the unknown token where the vocabulary has no
byte token). It works from the token -> id map and the scores alone: the equivalent BPE merge table
of a 262,144-token vocabulary has 514,847 merges, and building it for the `tokenizers` library
cost ~275 MiB at peak and 139 MiB kept (Gemma 3), against ~40 MiB for this map.
Also the vocabulary lookups (`token_to_id`, `id_to_token`) that `Tokenizer` exposes.
Imports: zinc.tokenizer.vocab.
"""

from __future__ import annotations

import heapq
from array import array

from zinc.tokenizer.vocab import Vocab


class SpmEngine:
    """Score-ranked pair merging over one vocabulary; immutable after construction, thread-safe."""

    def __init__(self, vocab: Vocab) -> None:
        self._ids = vocab.ids  # token text -> id (the file's own strings, not copied)
        self._tokens = vocab.tokens
        self._neg_scores = array("d", map(float.__neg__, vocab.scores))
        unk = vocab.special.get("unk")
        byte_ids = [vocab.ids.get(f"<0x{b:02X}>", unk) for b in range(256)]
        self._bytes = [[] if t is None else [t] for t in byte_ids]

    def token_to_id(self, text: str) -> int | None:
        return self._ids.get(text)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokens[token_id] if 0 <= token_id < len(self._tokens) else None

    def encode(self, text: str) -> list[int]:
        """The ids of `text`: the merge loop above, then each symbol's token or bytes."""
        ids, neg = self._ids, self._neg_scores
        syms = list(text)
        n = len(syms)
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []
        for i in range(n - 1):
            pair = syms[i] + syms[i + 1]
            tid = ids.get(pair)
            if tid is not None:
                heap.append((neg[tid], i, i + 1, len(pair)))
        heapq.heapify(heap)
        push = heapq.heappush
        pop = heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or len(a) + len(b) != size:
                continue  # one side was merged elsewhere since this pair was queued
            joined = a + b
            syms[left], syms[right] = joined, ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
                pair = joined + syms[after]
                tid = ids.get(pair)
                if tid is not None:
                    push(heap, (neg[tid], left, after, len(pair)))
            before = prv[left]
            if before >= 0:
                pair = syms[before] + joined
                tid = ids.get(pair)
                if tid is not None:
                    push(heap, (neg[tid], before, left, len(pair)))
        out: list[int] = []
        for sym in syms:
            if sym:
                tid = ids.get(sym)
                if tid is not None:
                    out.append(tid)
                else:
                    for byte in sym.encode("utf-8"):
                        out.extend(self._bytes[byte])
        return out
