"""`POST /infill`: fill-in-the-middle, in llama.cpp's server request and response shapes.

Owns: `parse_infill` (`input_prefix` and `input_suffix`, strings, required; `input_extra`, a list
of {`filename`, `text`}; `prompt`, text that continues the prefix; `n_predict` (or `max_tokens`;
-1: the default) and the usual sampling fields, `stop`, `stream`), `infill_prompt` (the token
layout llama.cpp's server builds, zinc.server.fim) and `InfillApi`, the handler: the answer is llama.cpp's
completion object (`content`, `stop`, `stop_type` "eos"/"limit"/"word", `stopping_word`,
`tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `prompt`, `timings`, ...), streamed as
`data:` chunks of `content` with a last one that has `stop: true` and the totals (no `[DONE]`, as
llama.cpp's own /infill).
Imports: zinc.engine.types, zinc.errors, zinc.server (api, error_table, exchange, fim,
openai_request, openai_response), orjson, the stdlib.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from zinc.engine.types import GenerationRequest, TextDelta
from zinc.errors import InvalidRequestError, ZincError
from zinc.server.api import OpenAIApi, ending
from zinc.server.error_table import describe
from zinc.server.exchange import Exchange, HttpRequest
from zinc.server.fim import ExtraChunk, FimText, engine_fim_prompt, fim_prompt
from zinc.server.openai_request import CommonParams, decode_json, parse_common
from zinc.server.openai_response import SSE_HEADERS, sse_event

log = logging.getLogger("zinc.server")
Json = dict[str, Any]
SAMPLING_FIELDS = (
    "temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "logit_bias", "stop", "stream", "model",
)  # fmt: skip


@dataclass(frozen=True)
class InfillParams:
    common: CommonParams
    prefix: str
    suffix: str
    extra: tuple[ExtraChunk, ...]
    prompt: str


def parse_infill(payload: Json) -> InfillParams:
    prefix = _string(payload, "input_prefix", required=True)
    suffix = _string(payload, "input_suffix", required=True)
    prompt = _string(payload, "prompt", required=False)
    extra = payload.get("input_extra")
    if extra is None:
        extra = []
    if not isinstance(extra, list):
        raise InvalidRequestError(
            "'input_extra' must be an array of {'filename', 'text'} objects.", param="input_extra"
        )
    chunks = tuple(_chunk(i, c) for i, c in enumerate(extra))
    fields: Json = {k: payload[k] for k in SAMPLING_FIELDS if k in payload}
    n_predict = payload.get("n_predict", payload.get("max_tokens"))
    if n_predict is not None:
        if not isinstance(n_predict, int) or isinstance(n_predict, bool) or n_predict == 0 or n_predict < -1:
            raise InvalidRequestError("'n_predict' must be -1 (the default) or a positive integer.", param="n_predict")
        if n_predict > 0:
            fields["max_tokens"] = n_predict
    n_probs = payload.get("n_probs")
    if n_probs not in (None, 0):
        raise InvalidRequestError("'n_probs' is not supported on /infill.", param="n_probs")
    return InfillParams(parse_common(fields), prefix, suffix, chunks, prompt)


def _string(payload: Json, name: str, *, required: bool) -> str:
    value = payload.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise InvalidRequestError(f"'{name}' is required and must be a string.", param=name)
    return value


def _chunk(index: int, chunk: Any) -> ExtraChunk:
    where = f"input_extra[{index}]"
    text = chunk.get("text") if isinstance(chunk, dict) else None
    if not isinstance(text, str):
        raise InvalidRequestError(f"'{where}' must be an object with a string 'text'.", param=f"{where}.text")
    filename = chunk.get("filename", "tmp")
    if not isinstance(filename, str):
        raise InvalidRequestError(f"'{where}.filename' must be a string.", param=f"{where}.filename")
    return ExtraChunk(filename, text)


def infill_prompt(
    params: InfillParams,
    special: Mapping[str, int],
    tokenize: Callable[[str], list[int]],
    bos: int | None,
    context: int,
) -> list[int]:
    """The FIM prompt's token ids for an /infill request (zinc.server.fim)."""
    text = FimText(params.prefix, params.suffix, params.prompt, params.extra)
    return fim_prompt(text, params.common.max_tokens, special, tokenize, bos, context, "input_prefix")


class InfillApi:
    """The /infill handler over the OpenAI API's generation path (admission, abort, errors)."""

    def __init__(self, api: OpenAIApi) -> None:
        self._api = api

    async def infill(self, request: HttpRequest, exchange: Exchange) -> None:
        params = parse_infill(decode_json(await exchange.body()))
        model = await self._api.select_model(params.common.model)
        engine = self._api.engine
        text = FimText(params.prefix, params.suffix, params.prompt, params.extra)
        ids = engine_fim_prompt(engine, text, params.common.max_tokens, "input_prefix")
        run = _Run(model, engine.detokenize(ids), len(ids), params.common)
        request_id = f"infill-{id(run):x}"
        async with self._api.generation(request_id, params.common, ids, "input_prefix", None) as (
            req,
            events,
            first,
        ):
            if params.common.stream:
                await run.stream(exchange, req, events, first)
            else:
                await run.whole(exchange, req, events, first)


class _Run:
    """One infill's answer in llama.cpp's completion shape."""

    def __init__(self, model: str, prompt: str, prompt_tokens: int, common: CommonParams) -> None:
        self.model, self.prompt, self.prompt_tokens, self.common = model, prompt, prompt_tokens, common
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.generated = 0

    def _count(self, event: TextDelta) -> None:
        if self.first_at is None:
            self.first_at = time.perf_counter()
        self.generated += len(event.token_ids)

    def _chunk(self, content: str) -> Json:
        return {
            "index": 0, "content": content, "tokens": [], "stop": False, "id_slot": -1,
            "tokens_predicted": self.generated, "tokens_evaluated": self.prompt_tokens,
        }  # fmt: skip

    def _final(self, content: str, last: TextDelta | None, req: GenerationRequest) -> Json:
        finish, usage = ending(last, req, self.generated)
        stopping_word = last.stop_sequence if last is not None and last.stop_sequence else ""
        stop_type = "limit" if finish == "length" else "word" if stopping_word else "eos"
        now = time.perf_counter()
        first = self.first_at or now
        prompt_ms, predicted_ms = (first - self.started) * 1e3, (now - first) * 1e3
        sampling = self.common.sampling
        return {
            **self._chunk(content),
            "stop": True,
            "model": self.model,
            "tokens_predicted": usage.completion_tokens,
            "tokens_evaluated": usage.prompt_tokens,
            "tokens_cached": usage.cached_tokens,
            "prompt": self.prompt,
            "has_new_line": "\n" in content,
            "truncated": False,
            "stop_type": stop_type,
            "stopping_word": stopping_word,
            "generation_settings": {
                "n_predict": req.max_tokens,
                "temperature": sampling.temperature,
                "top_k": sampling.top_k,
                "top_p": sampling.top_p,
                "min_p": sampling.min_p,
                "seed": sampling.seed,
                "stop": list(self.common.stop),
                "stream": self.common.stream,
            },
            "timings": {
                "prompt_n": usage.prompt_tokens - usage.cached_tokens,
                "prompt_ms": prompt_ms,
                "predicted_n": usage.completion_tokens,
                "predicted_ms": predicted_ms,
                "predicted_per_second": usage.completion_tokens / (predicted_ms / 1e3) if predicted_ms else 0.0,
            },
        }

    async def whole(
        self, exchange: Exchange, req: GenerationRequest, events: AsyncIterator[TextDelta], event: TextDelta | None
    ) -> None:
        content = ""
        last = event
        while event is not None:
            last = event
            self._count(event)
            content += event.text
            if event.finish_reason is not None:
                break
            event = await anext(events, None)
        body = self._final(content, last, req)
        exchange.note_usage(body["tokens_evaluated"], body["tokens_predicted"])
        await exchange.respond_json(200, orjson.dumps(body))

    async def stream(
        self, exchange: Exchange, req: GenerationRequest, events: AsyncIterator[TextDelta], event: TextDelta | None
    ) -> None:
        await exchange.start_stream(200, SSE_HEADERS)
        try:
            last = event
            while event is not None:
                last = event
                self._count(event)
                if event.text:
                    await exchange.send(sse_event(self._chunk(event.text)))
                if event.finish_reason is not None:
                    break
                event = await anext(events, None)
            body = self._final("", last, req)
            exchange.note_usage(body["tokens_evaluated"], body["tokens_predicted"])
            await exchange.send(sse_event(body))
        except Exception as exc:  # headers are out: report the failure inside the stream
            if not isinstance(exc, ZincError):
                log.error("infill failed mid-stream", exc_info=exc)
            await exchange.send(sse_event(describe(exc)[1]))
        await exchange.end()

