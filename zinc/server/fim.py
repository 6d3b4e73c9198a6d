"""The fill-in-the-middle prompt, as llama.cpp's server lays it out for /infill; /infill and the
`suffix` of /v1/completions both build it here.

Owns: `fim_prompt` (repo-level FIM: `[fim_rep]myproject\\n`, each extra chunk as
`[fim_sep]filename\\n` + its text (`\\n\\n--- snippet ---\\n\\n` before it when the model has no
`fim_sep`), `[fim_sep]filename\\n`, then `[BOS][fim_pre]prefix prompt[fim_suf]suffix[fim_mid]`;
the prefix keeps its last tokens and the suffix its first ones, in llama.cpp's 3:1 split of a
window of half the context, and the extra context fills what is left of the context but twice
the tokens to generate, its newest tokens kept), and `engine_fim_prompt`, the same over an
`Engine`'s tokenizer and special tokens. A model without the FIM prefix, suffix and middle tokens
(`tokenizer.ggml.fim_pre_token_id`, ... or the older `prefix/suffix/middle_token_id`) gets a 400.
Imports: zinc.engine.types, zinc.errors, the stdlib.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from zinc.engine.types import Engine
from zinc.errors import InvalidRequestError

FIM_WINDOW = 2048  # llama.cpp's batch size, the prefix + suffix window's largest size
FIM_NEEDED = ("fim_pre", "fim_suf", "fim_mid")
REPO_NAME = "myproject\n"  # what llama.cpp names the repository (it takes no name from the request)
FILE_NAME = "filename\n"  # and the file being edited
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks when the model has no fim_sep


@dataclass(frozen=True)
class ExtraChunk:
    filename: str
    text: str


@dataclass(frozen=True)
class FimText:
    """The text around the gap: `prompt` continues the prefix; `extra` is other files' text."""

    prefix: str
    suffix: str
    prompt: str = ""
    extra: tuple[ExtraChunk, ...] = ()


def fim_prompt(
    text: FimText,
    max_tokens: int,
    special: Mapping[str, int],
    tokenize: Callable[[str], list[int]],
    bos: int | None,
    context: int,
    param: str,
) -> list[int]:
    """The FIM prompt's token ids (module docstring); a 400 naming `param` without FIM tokens.

    `tokenize` splits text without special tokens (none added, none parsed); `bos` is prepended
    to the FIM part when the model adds one."""
    missing = [name for name in FIM_NEEDED if name not in special]
    if missing:
        raise InvalidRequestError(
            f"This model cannot infill: its GGUF declares no {', '.join(missing)} token "
            f"(tokenizer.ggml.{missing[0]}_token_id).",
            param=param,
        )
    rep, sep = special.get("fim_rep"), special.get("fim_sep")
    extra: list[int] = []
    if rep is not None:
        extra += [rep, *tokenize(REPO_NAME)]
    for chunk in text.extra:
        extra += [sep, *tokenize(chunk.filename + "\n")] if sep is not None else tokenize(SNIPPET_SEPARATOR)
        extra += tokenize(chunk.text)
    if sep is not None:
        extra += [sep, *tokenize(FILE_NAME)]
    prompt = tokenize(text.prompt) if text.prompt else []
    window = min(FIM_WINDOW, context // 2)
    prefix = tokenize(text.prefix)
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (window // 4)) :]  # the end nearest the gap
    suffix = tokenize(text.suffix)[: max(0, window // 4 - (2 + len(prompt)))]
    n_extra = min(max(0, context - window - 2 * max_tokens), len(extra))
    head = extra[len(extra) - n_extra :] + ([bos] if bos is not None else [])
    return [*head, special["fim_pre"], *prefix, *prompt, special["fim_suf"], *suffix, special["fim_mid"]]


def engine_fim_prompt(engine: Engine, text: FimText, max_tokens: int, param: str) -> list[int]:
    """`fim_prompt` with `engine`'s special tokens, tokenizer and context."""
    special = engine.special_tokens()
    head = engine.tokenize("", add_special=True)
    bos = special.get("bos") if head[:1] == [special.get("bos")] else None

    def tokenize(piece: str) -> list[int]:
        return engine.tokenize(piece, add_special=False, parse_special=False)

    return fim_prompt(text, max_tokens, special, tokenize, bos, engine.context_length, param)


def fim_texts(prompts: Sequence[str | tuple[int, ...]], suffix: str) -> list[FimText]:
    """Completions' text prompts with their `suffix` (token-id prompts cannot take one: 400)."""
    out = []
    for prompt in prompts:
        if not isinstance(prompt, str):
            raise InvalidRequestError("'suffix' needs a text prompt, not token ids.", param="suffix")
        out.append(FimText(prompt, suffix))
    return out
