"""The vocabulary of a GGUF model, read the way llama.cpp's `llama_vocab::load` reads it.

Owns: `Vocab` (token texts, effective token kinds, scores, merges, special ids, add-BOS/EOS flags,
the end-of-generation set and the byte piece of every token) and `load_vocab(metadata)`. A `Vocab`
is only the input for building a `Tokenizer`, which keeps none of it; `merges` is the file's own
list of "left right" strings (not copied), split by the backend.
llama.cpp adjusts the file's token types after loading (an end-of-turn token that is not marked
control becomes control, e.g. Gemma's `</s>`); `Vocab.kinds` holds those effective kinds.
Imports: numpy, zinc.errors, zinc.tokenizer.pretokenize.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zinc.errors import GGUFError, UnsupportedModelError
from zinc.tokenizer.pretokenize import pre_tokenizer_spec

# GGUF token types (gguf.TokenType); UNDEFINED covers 0 and anything unknown.
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 0, 1, 2, 3, 4, 5, 6

SPM_SPACE = "\u2581"  # SentencePiece's visible space, "▁"

# Token texts llama.cpp treats as end of generation (llama-vocab.cpp, `special_eog_ids`).
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "[e~[",
    }
)
# Texts llama.cpp uses to find tokens the metadata did not name (first match wins).
_EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<end_of_utterance>",
)
_FIND_BY_TEXT: dict[str, tuple[str, ...]] = {
    "eot": _EOT_TEXTS,
    "eom": ("<|eom_id|>",),
    "fim_pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<\uff5cfim\u2581begin\uff5c>",
        "<PRE>",
        "\u2581<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<\uff5cfim\u2581hole\uff5c>",
        "<SUF>",
        "\u2581<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<\uff5cfim\u2581end\uff5c>",
        "<MID>",
        "\u2581<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_ID_KEYS = {
    "bos": "bos_token_id",
    "eos": "eos_token_id",
    "eot": "eot_token_id",
    "eom": "eom_token_id",
    "unk": "unknown_token_id",
    "sep": "seperator_token_id",
    "pad": "padding_token_id",
    "mask": "mask_token_id",
    "fim_pre": "fim_pre_token_id",
    "fim_suf": "fim_suf_token_id",
    "fim_mid": "fim_mid_token_id",
    "fim_pad": "fim_pad_token_id",
    "fim_rep": "fim_rep_token_id",
    "fim_sep": "fim_sep_token_id",
}
_DEPRECATED_FIM_KEYS = {
    "fim_pre": "prefix_token_id",
    "fim_suf": "suffix_token_id",
    "fim_mid": "middle_token_id",
}
# llama.cpp's defaults per tokenizer model: (bos, eos, unk, add_bos, add_space_prefix)
_MODEL_DEFAULTS: dict[str, tuple[int | None, int | None, int | None, bool, bool]] = {
    "llama": (1, 2, 0, True, True),
    "gpt2": (11, 11, None, False, False),
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE token texts use it)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_UNICODE = _bytes_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in BYTE_TO_UNICODE.items()}
# str.translate table for the fast path of `_decode_piece`: each byte-level character becomes the
# latin-1 character of its byte; any other character below U+0100 becomes U+FFFF, so that
# `encode("latin-1")` fails and the exact (slow) path handles that piece.
_TO_LATIN1: dict[int, int] = {
    **{i: 0xFFFF for i in range(256)},
    **{ord(c): b for c, b in UNICODE_TO_BYTE.items()},
}


# `_byte_level_pieces`' table: code point -> the byte it stands for, 0x100 for one that stands for none
_BYTE_OF_CODE = np.full(max(map(ord, UNICODE_TO_BYTE)) + 1, 0x100, np.uint16)
_BYTE_OF_CODE[[ord(c) for c in UNICODE_TO_BYTE]] = list(UNICODE_TO_BYTE.values())


def as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


@dataclass(frozen=True, eq=False)
class Vocab:
    model: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)
    pre: str  # tokenizer.ggml.pre ("default" when absent)
    tokens: list[str]
    kinds: list[int]  # effective token types, after llama.cpp's adjustments
    scores: list[float]
    merges: Sequence[str]  # ranked "left right" merges as in the file (gpt2 only)
    ids: dict[str, int]
    special: dict[str, int]  # "bos", "eos", "eot", ... -> id (absent keys are unset)
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog_ids: frozenset[int]
    pieces: list[bytes]  # the bytes each token decodes to (special tokens: their text)

    @property
    def is_spm(self) -> bool:
        return self.model == "llama"


def _decode_piece(model: str, text: str, kind: int) -> bytes:
    if kind in (CONTROL, UNKNOWN, USER_DEFINED):
        return text.encode("utf-8")
    if kind == BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        return bytes([int(text[3:5], 16)])
    if kind != NORMAL:
        return b""  # unused / undefined tokens decode to nothing, as in llama.cpp
    if model == "llama":
        return text.replace(SPM_SPACE, " ").encode("utf-8")
    try:
        return text.translate(_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        pass
    table = UNICODE_TO_BYTE
    return b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in text)


def _pieces(model: str, tokens: list[str], kinds: list[int]) -> list[bytes]:
    """Every token's piece, as `_decode_piece` gives it, with the normal tokens' common case
    written inline (a call per token took most of the time a 262k vocabulary took to load), and
    a byte-level vocabulary's mapped in one pass (`_byte_level_pieces`)."""
    if model == "llama":
        pairs = zip(tokens, kinds, strict=True)
        return [t.replace(SPM_SPACE, " ").encode() if k == NORMAL else _decode_piece(model, t, k) for t, k in pairs]
    others = [i for i, k in enumerate(kinds) if k != NORMAL]  # mapped one by one below
    texts = list(tokens) if others else tokens
    for i in others:
        texts[i] = ""
    pieces = _byte_level_pieces(texts)
    if pieces is None:  # a normal token with a character outside GPT-2's byte map
        return [_decode_piece(model, t, k) for t, k in zip(tokens, kinds, strict=True)]
    for i in others:
        pieces[i] = _decode_piece(model, tokens[i], kinds[i])
    return pieces


def _byte_level_pieces(texts: list[str]) -> list[bytes] | None:
    """Each text's GPT-2 byte-level characters as the bytes they stand for, all the texts mapped
    in one numpy pass (a `str.translate` per token took 35 ms of SmolLM2's 49k tokens, this 15),
    or None where a character is not in the byte map."""
    try:
        codes = np.frombuffer("".join(texts).encode("utf-32-le"), np.uint32)
    except UnicodeEncodeError:  # a lone surrogate
        return None
    if codes.size and int(codes.max()) >= _BYTE_OF_CODE.size:
        return None
    mapped = _BYTE_OF_CODE[codes]
    if codes.size and int(mapped.max()) > 0xFF:
        return None
    blob = mapped.astype(np.uint8).tobytes()
    return [blob[start:end] for start, end in itertools.pairwise(itertools.accumulate(map(len, texts), initial=0))]


def _duplicate(tokens: list[str]) -> None:
    """Raise for the first token text that has two ids."""
    ids: dict[str, int] = {}
    for i, text in enumerate(tokens):
        if ids.setdefault(text, i) != i:
            raise GGUFError(f"duplicate token in vocabulary: {text!r} has ids {ids[text]} and {i}")


def _int_list(meta: Mapping[str, Any], key: str, n: int, default: int) -> list[int]:
    values = meta.get(key)
    if values is None:
        return [default] * n
    if not isinstance(values, Sequence) or len(values) < n:
        raise GGUFError(
            f"GGUF key {key} has {len(values) if isinstance(values, Sequence) else 0} entries, expected {n}"
        )
    return list(map(int, values[:n]))


def load_vocab(meta: Mapping[str, Any]) -> Vocab:
    """Read `tokenizer.ggml.*` keys; unsupported tokenizer types raise `UnsupportedModelError`."""
    model = str(meta.get("tokenizer.ggml.model", ""))
    if model not in _MODEL_DEFAULTS:
        raise UnsupportedModelError(
            f"tokenizer model {model!r} is not supported (zinc supports 'gpt2' byte-level BPE and 'llama' SentencePiece)"
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise GGUFError("GGUF has no tokenizer.ggml.tokens list")
    if not all(tokens):
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    n = len(tokens)
    ids = dict(zip(tokens, range(n), strict=True))  # one C-level pass: no Python call per token
    if len(ids) != n:
        _duplicate(tokens)
    kinds = [
        k if 0 < k <= BYTE else UNDEFINED for k in _int_list(meta, "tokenizer.ggml.token_type", n, NORMAL)
    ]
    raw_scores = meta.get("tokenizer.ggml.scores")
    scores = list(map(float, raw_scores[:n])) if isinstance(raw_scores, list) else [0.0] * n
    merges: Sequence[str] = ()
    if model == "gpt2":
        raw_merges = meta.get("tokenizer.ggml.merges")
        if not isinstance(raw_merges, list):
            raise GGUFError("GGUF has a gpt2 tokenizer but no tokenizer.ggml.merges")
        merges = raw_merges

    bos, eos, unk, add_bos, add_space_prefix = _MODEL_DEFAULTS[model]
    special: dict[str, int] = {
        k: v for k, v in (("bos", bos), ("eos", eos), ("unk", unk)) if v is not None and v < n
    }
    for name, key in _ID_KEYS.items():
        for full in (f"tokenizer.ggml.{key}", f"tokenizer.ggml.{_DEPRECATED_FIM_KEYS.get(name, key)}"):
            value = meta.get(full)
            if isinstance(value, int) and 0 <= value < n:
                special[name] = value
    pre = str(meta.get("tokenizer.ggml.pre") or "default")
    if model == "gpt2":
        add_bos = pre_tokenizer_spec(pre).add_bos
    add_bos = as_bool(meta.get("tokenizer.ggml.add_bos_token", add_bos))
    add_eos = as_bool(meta.get("tokenizer.ggml.add_eos_token", False))
    add_space_prefix = as_bool(meta.get("tokenizer.ggml.add_space_prefix", add_space_prefix))
    if add_bos and "bos" not in special:
        raise GGUFError("tokenizer.ggml.add_bos_token is true, but there is no BOS token id")
    if add_eos and "eos" not in special:
        raise GGUFError("tokenizer.ggml.add_eos_token is true, but there is no EOS token id")

    # llama.cpp finds unnamed end-of-turn / FIM tokens by their text and makes them control tokens.
    for name, texts in _FIND_BY_TEXT.items():
        found = [ids[t] for t in texts if t in ids]
        if name not in special and found:
            special[name] = min(found)
            kinds[special[name]] = CONTROL
    eog = {special[k] for k in ("fim_pad", "fim_rep", "fim_sep") if k in special}
    for text in EOG_TEXTS & ids.keys():
        eog.add(ids[text])
        kinds[ids[text]] = CONTROL
    for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
        if text in ids:
            kinds[ids[text]] = USER_DEFINED  # llama.cpp's gpt-oss rule: always rendered
    eog.update(special[k] for k in ("eos", "eot", "eom") if k in special)
    texts_in_eog = {tokens[i]: i for i in eog}
    if "<|end|>" in texts_in_eog and (
        ("<|return|>" in texts_in_eog and "<|call|>" in texts_in_eog)
        or ("<|calls|>" in texts_in_eog and "<|flush|>" in texts_in_eog)
    ):
        eog.discard(
            texts_in_eog["<|end|>"]
        )  # o200k_harmony / solar-open: <|end|> ends a message, not generation
        kinds[texts_in_eog["<|end|>"]] = USER_DEFINED
    if "<|tool_response>" in texts_in_eog and "</s>" in texts_in_eog:
        eog.discard(texts_in_eog["</s>"])  # gemma4
        kinds[texts_in_eog["</s>"]] = NORMAL

    pieces = _pieces(model, tokens, kinds)
    return Vocab(
        model=model,
        pre=pre,
        tokens=tokens,
        kinds=kinds,
        scores=scores,
        merges=merges,
        ids=ids,
        special=special,
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=add_space_prefix,
        eog_ids=frozenset(eog),
        pieces=pieces,
    )
