"""The engines behind `Tokenizer`: one raw stretch of text (special tokens split off) -> ids.

Owns: the `Engine` protocol and `build_backend(vocab)`, which picks the engine:
- `gpt2` vocabularies: the pre-type's split regexes, GPT-2 byte-level mapping, then BPE with the
  file's ranked merges (llama.cpp's `llm_tokenizer_bpe_session`). A byte with no token of its own
  (SmolLM2 has none for F1, F2 and a few control bytes) stays in place as the placeholder id
  `unknown_id(vocab)`, so that it keeps its neighbours from merging as in llama.cpp; the caller
  drops it afterwards, since llama.cpp emits nothing for it.
  This one is the HuggingFace `tokenizers` library's BPE with a pre-tokenizer.
- `llama` vocabularies (SentencePiece BPE, e.g. Gemma): `SpmEngine`, llama.cpp's score-ranked
  merge loop in Python (`zinc.tokenizer.spm`); spaces are already `▁`. (BPE with one merge per way
  of cutting each token in two gives the same ids, but that table costs hundreds of MiB.)
The engine's vocabulary (text <-> id; for gpt2 holding the placeholder one past the real ids) is
also the one `Tokenizer.token_id` / `token_text` read, so no second copy of it is kept.
Imports: tokenizers, zinc.tokenizer.vocab, zinc.tokenizer.pretokenize, zinc.tokenizer.spm.
"""

from __future__ import annotations

import gc
from typing import Protocol

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from zinc.tokenizer.pretokenize import pre_tokenizer_spec
from zinc.tokenizer.spm import SpmEngine
from zinc.tokenizer.vocab import Vocab


class Engine(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def token_to_id(self, text: str) -> int | None: ...
    def id_to_token(self, token_id: int) -> str | None: ...


def _gpt2_merges(vocab: Vocab) -> list[tuple[str, str]]:
    """The file's merges split at the first space after the first character. The collector is
    paused meanwhile: Llama 3's 280k new pairs would start hundreds of collections, a third of the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return [(m[:pos], m[pos + 1 :]) for m in vocab.merges if (pos := m.find(" ", 1)) > 0]
    finally:
        if enabled:
            gc.enable()


def _known_merges(merges: list[tuple[str, str]], ids: dict[str, int]) -> list[tuple[str, str]]:
    """The merges whose two parts and result are all tokens (llama.cpp skips the others)."""
    return [(a, b) for a, b in merges if a in ids and b in ids and a + b in ids]


_PLACEHOLDER = "\x00zinc:no-token\x00"


def unknown_id(vocab: Vocab) -> int:
    """The id the gpt2 backend gives to a byte that has no token (one past the vocabulary)."""
    return len(vocab.tokens)


class _Gpt2Engine:
    """A `tokenizers.Tokenizer` with the pre-type's split regexes, byte-level mapping and BPE."""

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self.token_to_id = tok.token_to_id
        self.id_to_token = tok.id_to_token

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids


def build_backend(vocab: Vocab) -> Engine:
    if vocab.is_spm:
        return SpmEngine(vocab)
    spec = pre_tokenizer_spec(vocab.pre)
    ids = dict(vocab.ids)
    ids[_PLACEHOLDER] = unknown_id(vocab)
    merges = _gpt2_merges(vocab)
    try:  # `tokenizers` checks every merge itself: checking them here first took most of a 1B model's start
        model = models.BPE(vocab=ids, merges=merges, unk_token=_PLACEHOLDER, ignore_merges=spec.ignore_merges)
    except Exception:  # a merge of a token the file lacks (it raises a bare Exception)
        merges = _known_merges(merges, ids)
        model = models.BPE(vocab=ids, merges=merges, unk_token=_PLACEHOLDER, ignore_merges=spec.ignore_merges)
    tok = Tokenizer(model)
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in spec.regexes
    ]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    return _Gpt2Engine(tok)
