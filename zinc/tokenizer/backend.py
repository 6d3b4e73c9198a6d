"""The BPE engines behind `Tokenizer`, built with the HuggingFace `tokenizers` library.

Owns: `build_backend(vocab)`, which returns a `tokenizers.Tokenizer` that turns one raw stretch of
text (special tokens already split off) into ids:
- `gpt2` vocabularies: the pre-type's split regexes, GPT-2 byte-level mapping, then BPE with the
  file's ranked merges (llama.cpp's `llm_tokenizer_bpe_session`). A byte with no token of its own
  (SmolLM2 has none for F1, F2 and a few control bytes) stays in place as the placeholder id
  `unknown_id(vocab)`, so that it keeps its neighbours from merging as in llama.cpp; the caller
  drops it afterwards, since llama.cpp emits nothing for it.
- `llama` vocabularies (SentencePiece BPE, e.g. Gemma): no pre-splitting; spaces are already `▁`.
  llama.cpp's `llm_tokenizer_spm_session` repeatedly joins the adjacent pair whose concatenation is
  a token with the highest score (leftmost on ties) and spells leftover characters as `<0xNN>`
  byte tokens. The same result comes from BPE with byte fallback and one merge per way of cutting
  each token in two, ranked by the token's score (tests check this against a direct port).
The backend's vocabulary (text <-> id, holding the gpt2 placeholder one past the real ids) is also
the one `Tokenizer.token_id` / `token_text` read, so no Python copy of it is kept.
Imports: tokenizers, zinc.tokenizer.vocab, zinc.tokenizer.pretokenize.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from zinc.tokenizer.pretokenize import pre_tokenizer_spec
from zinc.tokenizer.vocab import Vocab


def _spm_merges(vocab: Vocab) -> list[tuple[str, str]]:
    """Ranked by (-score, token id, cut): tokens sorted by (-score, id), each one's cuts in order."""
    ids, scores, tokens = vocab.ids, vocab.scores, vocab.tokens
    merges: list[tuple[str, str]] = []
    for tok in sorted(range(len(tokens)), key=lambda t: (-scores[t], t)):
        text = tokens[tok]
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in ids and right in ids:
                merges.append((left, right))
    return merges


def _gpt2_merges(vocab: Vocab) -> list[tuple[str, str]]:
    """The file's merges split at the first space after the first character, if all three are tokens."""
    ids = vocab.ids
    merges: list[tuple[str, str]] = []
    for m in vocab.merges:
        pos = m.find(" ", 1)
        if pos > 0:
            a, b = m[:pos], m[pos + 1 :]
            if a in ids and b in ids and a + b in ids:
                merges.append((a, b))
    return merges


_PLACEHOLDER = "\x00zinc:no-token\x00"


def unknown_id(vocab: Vocab) -> int:
    """The id the gpt2 backend gives to a byte that has no token (one past the vocabulary)."""
    return len(vocab.tokens)


def build_backend(vocab: Vocab) -> Tokenizer:
    if vocab.is_spm:
        model = models.BPE(vocab=vocab.ids, merges=_spm_merges(vocab), byte_fallback=True)
        return Tokenizer(model)
    spec = pre_tokenizer_spec(vocab.pre)
    ids = dict(vocab.ids)
    ids[_PLACEHOLDER] = unknown_id(vocab)
    model = models.BPE(
        vocab=ids, merges=_gpt2_merges(vocab), unk_token=_PLACEHOLDER, ignore_merges=spec.ignore_merges
    )
    tok = Tokenizer(model)
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in spec.regexes
    ]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    return tok
