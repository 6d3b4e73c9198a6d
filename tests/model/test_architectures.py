"""The architecture registry and recipes: hyperparameters from GGUF metadata, clear errors for what
zinc cannot run, and proof that the fixture sequences exercise every recipe switch.

The last test flips each switch of a fixture's recipe in the float64 reference and checks that the
logits move far beyond the compiled-vs-reference tolerance of test_fixture_numerics, so a graph
that ignored the switch (a missing window mask, adjacent-pair instead of NEOX RoPE, no bias, ...)
could not pass there.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fixtures.real_shapes import llama3_rope_factors
from zinc.errors import GGUFError, UnsupportedModelError
from zinc.model.gguf_file import GGUFModel, open_gguf, resolve_model
from zinc.model.hparams import describe, supported_architectures
from zinc.model.reference import ReferenceModel


def edited(model: GGUFModel, drop: str = "", **meta: Any) -> GGUFModel:
    """The model with tensors whose name contains `drop` removed and metadata keys replaced."""
    tensors = {k: v for k, v in model.tensors.items() if not drop or drop not in k}
    return dataclasses.replace(model, tensors=tensors, metadata={**model.metadata, **meta})


def test_registry_names_every_architecture() -> None:
    assert supported_architectures() == ("gemma3", "llama", "qwen2", "qwen3")


def test_unknown_architecture_lists_the_supported_ones(tiny_models: dict[str, Path]) -> None:
    model = edited(open_gguf(tiny_models["tiny-q8-q41"]), **{"general.architecture": "mamba"})
    with pytest.raises(
        UnsupportedModelError,
        match=r"'mamba' is not supported \(zinc supports: gemma3, llama, qwen2, qwen3\)",
    ):
        describe(model)


def test_gemma3_270m_hparams() -> None:
    try:
        hp = describe(open_gguf(resolve_model("gemma3-270m"))).hparams
    except GGUFError as exc:
        pytest.skip(exc.message)
    assert (hp.block_count, hp.embedding_length, hp.head_count, hp.head_count_kv, hp.key_length) == (
        18,
        640,
        4,
        1,
        256,
    )
    assert [il for il in range(18) if not hp.is_swa(il)] == [5, 11, 17]  # every 6th layer is global
    assert hp.window(0) == 512 and hp.window(5) == 0
    assert (hp.rope_base(0), hp.rope_base(5)) == (10000.0, 1e6)
    assert hp.rope_type == "neox" and hp.rope_scale(5) == 1.0
    assert hp.q_scale() == 1 / 16 and hp.embedding_scale == math.sqrt(640)
    assert hp.tied_output and hp.final_logit_softcapping == 0.0 and hp.ffn_activation == "gelu"


def test_fixture_recipes(tiny_models: dict[str, Path]) -> None:
    hp = describe(open_gguf(tiny_models["tiny-gemma3-scaled"])).hparams
    assert [hp.window(il) for il in range(2)] == [3, 0]  # period 2: layer 0 local, layer 1 global
    assert (hp.rope_base(0), hp.rope_base(1)) == (500.0, 1e5)
    assert (hp.rope_scale(0), hp.rope_scale(1)) == (1.0, 0.25)  # linear scaling on global layers only
    assert hp.q_scale() == pytest.approx(24**-0.5) and hp.final_logit_softcapping == 10.0
    hp = describe(open_gguf(tiny_models["tiny-gemma3"])).hparams
    assert [hp.window(il) for il in range(6)] == [5, 5, 5, 5, 5, 0]  # llama.cpp's default period 6
    q2 = describe(open_gguf(tiny_models["tiny-qwen2"])).hparams
    assert q2.attn_qkv_bias and not q2.attn_qk_norm and q2.rope_type == "neox" and not q2.tied_output
    q3 = describe(open_gguf(tiny_models["tiny-qwen3"])).hparams
    assert q3.attn_qk_norm and q3.key_length == 32 and q3.head_count * q3.key_length != q3.embedding_length
    desc = describe(open_gguf(tiny_models["tiny-llama3-ropefreqs"]))
    factors = llama3_rope_factors(16, 500000.0, 8.0, old_ctx=64)  # as fixtures/make_fixtures.py writes them
    assert desc.hparams.rope_freq_factors == tuple(float(f) for f in factors)
    assert factors[0] == 1.0 and 1.0 < factors[1] < 8.0 and factors[-1] == 8.0  # high, between, low frequencies
    assert desc.tensor_types["rope_freqs.weight"] == "F32"
    assert describe(open_gguf(tiny_models["tiny-q8-q41"])).hparams.rope_freq_factors == ()


@pytest.mark.parametrize(
    ("fixture", "drop", "meta", "error", "message"),
    [
        ("tiny-qwen2", "attn_q.bias", {}, GGUFError, r"tensor blk\.0\.attn_q\.bias is missing"),
        ("tiny-qwen3", "attn_k_norm", {}, GGUFError, r"tensor blk\.0\.attn_k_norm\.weight is missing"),
        ("tiny-gemma3", "post_ffw_norm", {}, GGUFError, r"tensor blk\.0\.post_ffw_norm\.weight is missing"),
        ("tiny-gemma3", "", {"gemma3.attention.sliding_window_pattern": [True, False]}, UnsupportedModelError,
         "per layer"),
        ("tiny-qwen3", "", {"qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0},
         UnsupportedModelError, "'yarn' is not supported"),
        ("tiny-qwen3", "", {"qwen3.attention.value_length": 16}, UnsupportedModelError, "value_length"),
        ("tiny-qwen2", "", {"qwen2.attention.head_count_kv": 3}, UnsupportedModelError, "do not group"),
        ("tiny-llama3-ropefreqs", "", {"llama.rope.dimension_count": 8}, GGUFError,
         r"rope_freqs\.weight has shape \[8\], expected \[4\]"),
    ],
)  # fmt: skip
def test_bad_models_are_clear_errors(
    tiny_models: dict[str, Path], fixture: str, drop: str, meta: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        describe(edited(open_gguf(tiny_models[fixture]), drop, **meta))


@pytest.mark.parametrize(("fixture", "name"), [("tiny-qwen2", "blk.1.attn_v.bias"),
                                               ("tiny-llama3-ropefreqs", "rope_freqs.weight")])
def test_vectors_must_be_f32(tiny_models: dict[str, Path], fixture: str, name: str) -> None:
    model = open_gguf(tiny_models[fixture])
    tensors = {**model.tensors, name: dataclasses.replace(model.tensors[name], type_name="F16")}
    with pytest.raises(UnsupportedModelError, match=re.escape(name) + " is F16"):
        describe(dataclasses.replace(model, tensors=tensors))


SWITCHES = {
    "tiny-qwen2": [{"attn_qkv_bias": False}, {"rope_type": "norm"}],
    "tiny-qwen3": [{"attn_qk_norm": False}, {"rope_type": "norm"}],
    "tiny-gemma3": [
        {"sliding_window": 0}, {"sliding_window_pattern": 3}, {"rope_type": "norm"}, {"rope_freq_base_swa": 0.0},
        {"ffn_activation": "silu"}, {"post_norms": False}, {"attn_qk_norm": False}, {"embedding_scale": 1.0},
    ],
    "tiny-gemma3-scaled": [
        {"final_logit_softcapping": 0.0}, {"rope_freq_scale": 1.0}, {"attention_scale": 0.0}, {"sliding_window": 0},
    ],
    "tiny-llama3-ropefreqs": [{"rope_freq_factors": ()}],
}  # fmt: skip


def _sequence_logits(ref: ReferenceModel) -> np.ndarray[Any, Any]:
    """The last logits of each step of test_fixture_numerics' sequence, stacked."""
    ref.reset()
    out = [ref.forward([3, 17, 200, 5, 9, 11])[-1]]
    out += [ref.forward([t])[-1] for t in (7, 100, 42, 0)]
    out.append(ref.forward([1, 2, 3, 250])[-1])
    out.append(ref.forward([(i * 37) % 300 for i in range(21)])[-1])
    return np.stack(out)


@pytest.mark.parametrize("fixture", list(SWITCHES))
def test_sequences_exercise_every_switch(tiny_models: dict[str, Path], fixture: str) -> None:
    ref = ReferenceModel(open_gguf(tiny_models[fixture]))
    base = _sequence_logits(ref)
    hp = ref.hp
    for change in SWITCHES[fixture]:
        ref.hp = dataclasses.replace(hp, **change)
        moved = float(np.abs(_sequence_logits(ref) - base).max() / np.abs(base).max())
        assert moved > 1e-3, f"{fixture}: {change} moves the logits by only {moved:.1e}"
    ref.hp = hp


def test_qwen2_adds_its_q_and_k_biases_inside_rope(tiny_models: dict[str, Path]) -> None:
    """q's and k's biases go into the NEOX RoPE dispatch; only v's (no RoPE after it) is an add of its own."""
    from zinc.compiler.graph import emit_module

    desc = describe(open_gguf(tiny_models["tiny-qwen2"]))
    layers = desc.hparams.block_count
    mod = emit_module(desc, tiled=True, dot8=True, batch_sizes=(1, 4))
    for entry in mod.entries:
        name = re.match(r"func\.func @(\w+)\(", entry).group(1)  # type: ignore[union-attr]
        if name.startswith(("decode_b", "prefill")):
            assert len(re.findall(r"call @bias_", entry)) == layers, name
            assert len(re.findall(r"call @rope_neox_\w+_bias\(", entry)) == 2 * layers, name
