"""`POST /v1/embeddings`: OpenAI's embeddings API, for models whose GGUF declares a pooling.

Owns: `parse_embeddings` (`input`: a string, a list of strings, a list of token ids or a list of
lists of token ids, at most `MAX_INPUTS`, none empty; `model`; `encoding_format` "float" (the
default) or "base64" (the little-endian float32 bytes, as OpenAI's SDK decodes them);
`dimensions`, from 1 to the model's width: the vectors are truncated, then renormalized; `user`,
ignored) and `EmbeddingsApi`, the handler: strings are tokenized as a completion's prompt is
(special tokens added as the GGUF says), every input is embedded by the engine
(zinc.engine.embeddings: pooled as the GGUF declares, L2-normalized), and the answer is OpenAI's
list object with `usage` (`prompt_tokens` = `total_tokens`). A model that declares no pooling, an
input longer than the context and malformed fields are 400s in OpenAI's envelope (from the
router, zinc.server.routes); admission and its 429 are the other endpoints' (`OpenAIApi.admission`).
Imports: zinc.engine.embeddings, zinc.errors, zinc.server.{api, exchange, openai_request}, numpy,
orjson, the stdlib.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from zinc.engine.embeddings import Embedder, Vector
from zinc.errors import InvalidRequestError
from zinc.server.api import OpenAIApi
from zinc.server.exchange import Exchange, HttpRequest
from zinc.server.openai_request import Json, decode_json

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingsParams:
    inputs: list[str | list[int]]  # each a text to tokenize or its token ids
    model: str | None
    encoding_format: str
    dimensions: int | None


def _token_ids(value: list[Any]) -> list[int] | None:
    """`value` as token ids when every item is a non-negative integer (not a boolean), else None."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if any(v < 0 for v in value):
            raise InvalidRequestError("'input' token ids must be non-negative integers.", param="input")
        return list(value)
    return None


def _inputs(value: Any) -> list[str | list[int]]:
    if isinstance(value, str):
        inputs: list[str | list[int]] = [value]
    elif isinstance(value, list) and value:
        ids = _token_ids(value)
        if ids is not None:
            inputs = [ids]
        elif all(isinstance(v, str) for v in value):
            inputs = list(value)
        elif all(isinstance(v, list) for v in value):
            inputs = []
            for item in value:
                item_ids = _token_ids(item)
                if item_ids is None:
                    raise InvalidRequestError(
                        "'input' lists must hold token ids (integers) only.", param="input"
                    )
                inputs.append(item_ids)
        else:
            raise InvalidRequestError(
                "'input' must be a string, a list of strings, a list of token ids or a list of lists of token "
                "ids, not a mix.", param="input",
            )  # fmt: skip
    elif value is None:
        raise InvalidRequestError("'input' is required.", param="input")
    else:
        raise InvalidRequestError(
            "'input' must be a non-empty string, list of strings, list of token ids or list of lists of token ids.",
            param="input",
        )
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequestError(
            f"'input' holds at most {MAX_INPUTS} items, not {len(inputs)}.", param="input"
        )
    if any(len(item) == 0 for item in inputs):
        raise InvalidRequestError("'input' must not hold an empty string or an empty list.", param="input")
    return inputs


def parse_embeddings(payload: Json) -> EmbeddingsParams:
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequestError("'model' must be a string.", param="model")
    encoding = payload.get("encoding_format")
    encoding = "float" if encoding is None else encoding
    if encoding not in ENCODINGS:
        raise InvalidRequestError("'encoding_format' must be 'float' or 'base64'.", param="encoding_format")
    dimensions = payload.get("dimensions")
    if dimensions is not None and (
        not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1
    ):
        raise InvalidRequestError("'dimensions' must be a positive integer.", param="dimensions")
    user = payload.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequestError("'user' must be a string.", param="user")
    return EmbeddingsParams(_inputs(payload.get("input")), model or None, encoding, dimensions)


def _encoded(vector: Vector, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


class EmbeddingsApi:
    def __init__(self, api: OpenAIApi) -> None:
        self._api = api

    async def create(self, request: HttpRequest, exchange: Exchange) -> None:
        params = parse_embeddings(decode_json(await exchange.body()))
        model = await self._api.select_model(params.model)
        engine = self._api.engine
        if not isinstance(engine, Embedder) or engine.pooling == "none":
            raise InvalidRequestError(
                f"The model '{model}' declares no pooling (mean, cls or last as its GGUF's pooling_type), so it "
                "serves no embeddings; serve an embedding model such as Qwen3-Embedding, or this one with "
                "`zinc serve --embeddings mean|cls|last`.",
                param="model",
            )
        width = engine.embedding_length
        if params.dimensions is not None and params.dimensions > width:
            raise InvalidRequestError(
                f"'dimensions' is at most {width} for the model '{model}', not {params.dimensions}.",
                param="dimensions",
            )
        # special tokens written in an input are those tokens, as llama.cpp's server reads them
        ids = [engine.tokenize(item, parse_special=True) if isinstance(item, str) else item for item in params.inputs]
        async with self._api.admission.slot():
            result = await engine.embed(ids, params.dimensions)
        body = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encoded(v, params.encoding_format)}
                for i, v in enumerate(result.vectors)
            ],
            "model": model,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
        }
        await exchange.respond_json(200, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))
