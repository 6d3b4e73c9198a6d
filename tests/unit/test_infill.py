"""`POST /infill` (issue 39): the request fields llama.cpp's server takes, and the FIM prompt laid
out as llama.cpp lays it out, with the tiny-fim fixture's real tokenizer (Qwen2.5-Coder's FIM
tokens, named by tokenizer.ggml.fim_*_token_id)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fixtures.make_fixtures import FIM_TOKENS
from tests.unit._models import read_metadata
from zinc.errors import InvalidRequestError
from zinc.server.infill_api import ExtraChunk, InfillParams, infill_prompt, parse_infill
from zinc.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_models: dict[str, Path]) -> Tokenizer:
    return Tokenizer.from_metadata(read_metadata(tiny_models["tiny-fim"]))


def text(tok: Tokenizer, s: str) -> list[int]:
    return tok.encode(s, add_special=False, parse_special=False)


def params(**fields: Any) -> InfillParams:
    return parse_infill({"input_prefix": "def f(x):\n    ", "input_suffix": "\n    return y\n", **fields})


def test_the_fixture_declares_the_fim_tokens(tok: Tokenizer) -> None:
    special = tok.special_ids
    for name, token in FIM_TOKENS.items():
        assert tok.token_text(special[name]) == token
    assert {special["fim_pad"], special["fim_rep"], special["fim_sep"]} <= tok.eog_ids


def test_older_files_name_them_prefix_suffix_middle(tiny_models: dict[str, Path]) -> None:
    meta = dict(read_metadata(tiny_models["tiny-fim"]))
    for name in FIM_TOKENS:
        meta.pop(f"tokenizer.ggml.{name}_token_id")
    meta.update({"tokenizer.ggml.prefix_token_id": 300, "tokenizer.ggml.suffix_token_id": 301,
                 "tokenizer.ggml.middle_token_id": 302})  # fmt: skip
    special = Tokenizer.from_metadata(meta).special_ids
    assert (special["fim_pre"], special["fim_suf"], special["fim_mid"]) == (300, 301, 302)


def test_the_layout_is_llama_cpps_repo_level_fim(tok: Tokenizer) -> None:
    special = tok.special_ids
    p = params(prompt="z = ", input_extra=[{"filename": "util.py", "text": "def g(): pass\n"}])
    ids = infill_prompt(p, special, lambda s: text(tok, s), None, 2048)
    expected = [
        special["fim_rep"], *text(tok, "myproject\n"),
        special["fim_sep"], *text(tok, "util.py\n"), *text(tok, "def g(): pass\n"),
        special["fim_sep"], *text(tok, "filename\n"),
        special["fim_pre"], *text(tok, "def f(x):\n    "), *text(tok, "z = "),
        special["fim_suf"], *text(tok, "\n    return y\n"),
        special["fim_mid"],
    ]  # fmt: skip
    assert ids == expected


def test_bos_goes_between_the_extra_context_and_the_fim_part(tok: Tokenizer) -> None:
    special = tok.special_ids
    ids = infill_prompt(params(), special, lambda s: text(tok, s), 1, 2048)
    at = ids.index(special["fim_pre"])
    assert ids[at - 1] == 1 and special["fim_sep"] in ids[: at - 1]


def test_without_fim_sep_extra_chunks_are_snippets(tok: Tokenizer) -> None:
    special = {k: v for k, v in tok.special_ids.items() if k not in ("fim_sep", "fim_rep")}
    ids = infill_prompt(params(input_extra=[{"text": "abc"}]), special, lambda s: text(tok, s), None, 2048)
    assert ids[: ids.index(special["fim_pre"])] == text(tok, "\n\n--- snippet ---\n\n") + text(tok, "abc")


def test_a_long_prefix_keeps_its_end_and_a_long_suffix_its_start(tok: Tokenizer) -> None:
    special = tok.special_ids
    prefix, suffix = "a" * 500, "b" * 500  # one token per character
    p = params(input_prefix=prefix + "END", input_suffix="START" + suffix, max_tokens=10)
    ids = infill_prompt(p, special, lambda s: text(tok, s), None, 256)  # a window of 128
    pre, suf, mid = (ids.index(special[k]) for k in ("fim_pre", "fim_suf", "fim_mid"))
    assert ids[suf - len(text(tok, "END")) : suf] == text(tok, "END") and suf - pre - 1 == 96
    assert ids[suf + 1 : suf + 1 + len(text(tok, "START"))] == text(tok, "START") and mid - suf - 1 == 30
    # the extra context gets what is left: 256 - 128 - 2 * 10 = 108 tokens, its newest
    p = params(input_extra=[{"text": "c" * 300 + "NEW"}], max_tokens=10)
    ids = infill_prompt(p, special, lambda s: text(tok, s), None, 256)
    head = ids[: ids.index(special["fim_pre"])]
    assert len(head) == 108 and head[-len(text(tok, "filename\n")) - 1] == special["fim_sep"]


def test_a_model_without_fim_tokens_is_a_400(tok: Tokenizer) -> None:
    with pytest.raises(InvalidRequestError) as info:
        infill_prompt(params(), {"bos": 1, "eos": 0}, lambda s: text(tok, s), None, 2048)
    assert "cannot infill" in info.value.message and "fim_pre" in info.value.message


def test_fields_parse_like_llama_cpps() -> None:
    p = parse_infill({"input_prefix": "a", "input_suffix": "b", "n_predict": 7, "temperature": 0.5,
                      "top_k": 3, "seed": 9, "stop": ["\n\n"], "stream": True,
                      "input_extra": [{"filename": "x.py", "text": "t"}, {"text": "u"}]})  # fmt: skip
    assert p.common.max_tokens == 7 and p.common.stream and p.common.stop == ("\n\n",)
    assert p.common.sampling.temperature == 0.5 and p.common.sampling.top_k == 3 and p.common.sampling.seed == 9
    assert p.extra == (ExtraChunk("x.py", "t"), ExtraChunk("tmp", "u"))
    assert parse_infill({"input_prefix": "a", "input_suffix": "b", "n_predict": -1}).common.max_tokens == 256
    assert parse_infill({"input_prefix": "a", "input_suffix": "b", "max_tokens": 5}).common.max_tokens == 5


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input_suffix": "b"}, "input_prefix"),
        ({"input_prefix": "a"}, "input_suffix"),
        ({"input_prefix": 1, "input_suffix": "b"}, "input_prefix"),
        ({"input_prefix": "a", "input_suffix": "b", "prompt": ["x"]}, "prompt"),
        ({"input_prefix": "a", "input_suffix": "b", "input_extra": {"text": "t"}}, "input_extra"),
        ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "f"}]}, "input_extra[0].text"),
        ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "t", "filename": 3}]},
         "input_extra[0].filename"),
        ({"input_prefix": "a", "input_suffix": "b", "n_predict": 0}, "n_predict"),
        ({"input_prefix": "a", "input_suffix": "b", "n_predict": "5"}, "n_predict"),
        ({"input_prefix": "a", "input_suffix": "b", "n_probs": 3}, "n_probs"),
        ({"input_prefix": "a", "input_suffix": "b", "temperature": "hot"}, "temperature"),
    ],
)  # fmt: skip
def test_bad_fields_are_400_naming_the_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_infill(fields)
    assert info.value.param == param
