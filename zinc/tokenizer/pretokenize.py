"""Pre-tokenizer settings per `tokenizer.ggml.pre`, as llama.cpp's `llm_tokenizer_bpe` defines them.

Owns: `PreTokenizerSpec` and `pre_tokenizer_spec(pre)`: the split regexes (applied one after the
other; matched and unmatched stretches both become pieces), whether merges are skipped for whole
words that are already tokens, and whether BOS is added by default. Only byte-level BPE (`gpt2`)
vocabularies use these. Checked against llama.cpp's own token ids for `smollm`; the other entries
follow llama-vocab.cpp's table and are not yet covered by golden data.
Imports: zinc.errors only (the regexes are compiled by the `tokenizers` library elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

from zinc.errors import UnsupportedModelError

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTR_I = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTR_I}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTR_I}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizerSpec:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is already a token is not split and merged
    add_bos: bool = False  # llama.cpp's default when tokenizer.ggml.add_bos_token is absent


_DEFAULT = PreTokenizerSpec((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_LLAMA3 = PreTokenizerSpec((LLAMA3,), ignore_merges=True, add_bos=True)
_SPECS: dict[str, PreTokenizerSpec] = {"default": _DEFAULT}
for _names, _spec in (
    (
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ),
        _LLAMA3,
    ),
    (("dbrx", "smaug-bpe"), PreTokenizerSpec((LLAMA3,))),
    (("falcon",), PreTokenizerSpec((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"))),
    (
        (
            "gpt-2",
            "phi-2",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
        ),
        PreTokenizerSpec((GPT2,)),
    ),
    (
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
        PreTokenizerSpec((r"\p{N}", GPT2)),
    ),
    (
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "solar-open", "megrez"),
        PreTokenizerSpec((QWEN2,)),
    ),
    (("gpt-4o", "llama4", "kanana2", "talkie"), PreTokenizerSpec((GPT4O,))),
    (("tekken",), PreTokenizerSpec((TEKKEN,), ignore_merges=True, add_bos=True)),
):
    for _name in _names:
        _SPECS[_name] = _spec


def pre_tokenizer_spec(pre: str) -> PreTokenizerSpec:
    """The settings for a `tokenizer.ggml.pre` value; an unknown one is `UnsupportedModelError`."""
    spec = _SPECS.get(pre)
    if spec is None:
        raise UnsupportedModelError(
            f"pre-tokenizer type {pre!r} (tokenizer.ggml.pre) is not supported; known: {', '.join(sorted(_SPECS))}"
        )
    return spec
