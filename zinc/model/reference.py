"""A numpy reference forward pass (float64) for the architectures zinc compiles: the test oracle.

Owns: `ReferenceModel`, which dequantizes GGUF weights with `gguf.quants.dequantize` and runs the
same math as the compiled graph, written plainly (llama2.c's `forward`, in numpy), one token
block at a time with its own KV cache. It follows the recipe in `HParams` (llama, qwen2, qwen3,
gemma3): NEOX or adjacent-pair RoPE with per-layer bases and Llama 3's per-pair frequency
factors, q/k/v biases, per-head QK RMSNorm, post-norms, SwiGLU or tanh-GELU gating,
sliding-window layers, embedding and query scales and final logit softcapping. With
`q8_activations`, it also follows the CPU's integer dot-product
kernels (`compiler/dot8.py`): where the weight is Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K with rows in groups of 8,
a matmul's activations are first rounded to Q8 per 32-block, as those kernels (and llama.cpp)
do. With `kv_f16`, cached keys and values are rounded to f16 as the KV slab stores them on every
target (the step that computes a position reads it rounded too). With `gemm` ("f16" or "f32"),
a block of more than one token follows the prompt chunks of a Vulkan named target
(zinc.compiler.gemm): its matmuls take no Q8 rounding, their operands rounded to `gemm`'s type
instead, and only the output head, a one-token kernel there, rounds to Q8 (with
`q8_activations`); a one-token block is a decode step, Q8 throughout. Slow by design; used by tests and for
debugging. `hidden` stops before the output head: the final hidden states an embedding pools.
Imports: numpy, gguf, zinc.model.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from zinc.model.gguf_file import GGUFModel
from zinc.model.hparams import describe

F64 = np.ndarray[Any, np.dtype[np.float64]]
Q8_WEIGHTS = (
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)  # the types whose matmuls take Q8 activations on the CPU (compiler/dot8_layout.py DOT8_TYPES)


def q8_round(x: F64) -> F64:
    """x rounded to Q8 per 32-block in f32, as the dot8 kernels do: d = max|x| / 127,
    q = round-half-even(x * 127 / max|x|), result q * d."""
    xb = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), np.float32(0))
    q = np.rint(xb * inv.astype(np.float32))
    return np.asarray((q * d).reshape(x.shape), dtype=np.float64)


def gelu_tanh(x: F64) -> F64:
    return np.asarray(0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3))))


def silu(x: F64) -> F64:
    return np.asarray(x / (1.0 + np.exp(-x)))


class _Weights(Mapping[str, F64]):
    """The model's tensors in float64 as [ne1, ne0], dequantized up front, or (`lazy`) the
    matrices each time they are read and the vectors once."""

    def __init__(self, reader: GGUFReader, lazy: bool) -> None:
        self._tensors = {t.name: t for t in reader.tensors}
        self._lazy = lazy
        self._kept = {n: self._load(n) for n, t in self._tensors.items() if not lazy or len(t.shape) == 1}

    def _load(self, name: str) -> F64:
        t = self._tensors[name]
        arr = dequantize(t.data, t.tensor_type).astype(np.float64)
        return arr.reshape([int(x) for x in reversed(t.shape)])

    def __getitem__(self, name: str) -> F64:
        kept = self._kept.get(name)
        return kept if kept is not None else self._load(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


class ReferenceModel:
    def __init__(
        self, model: GGUFModel, q8_activations: bool = False, kv_f16: bool = False, lazy: bool = False,
        gemm: str | None = None,
    ) -> None:
        """`lazy`: dequantize each matrix when a step uses it, not all up front (a 1B model's
        weights in float64 are 10 GB; one at a time, its output head's 2 GB)."""
        self.hp = describe(model).hparams
        reader = GGUFReader(model.path, "r")
        self.w: Mapping[str, F64] = _Weights(reader, lazy)
        self.q8_activations = q8_activations
        self.kv_f16 = kv_f16
        self.gemm = gemm
        self.head = "token_embd.weight" if self.hp.tied_output else "output.weight"
        self.q8_weights: set[str] = set()  # weights whose matmuls take Q8 activations
        for t in reader.tensors:
            if t.tensor_type.name in Q8_WEIGHTS and len(t.shape) == 2 and int(t.shape[1]) % 8 == 0:
                self.q8_weights.add(t.name)
        hp = self.hp
        self.k = np.zeros((hp.block_count, 0, hp.head_count_kv, hp.key_length))
        self.v = np.zeros_like(self.k)

    def reset(self) -> None:
        self.k = self.k[:, :0]
        self.v = self.v[:, :0]

    def _rms(self, x: F64, w: F64) -> F64:
        return np.asarray(
            x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.hp.layer_norm_rms_epsilon) * w
        )

    def _rope(self, x: F64, pos: F64, il: int) -> F64:  # x [T, H, hd]
        hp = self.hp
        nr = hp.rope_dimension_count
        i = np.arange(nr // 2)
        theta = (pos * hp.rope_scale(il))[:, None] * hp.rope_base(il) ** (-2.0 * i / nr)  # [T, nr/2]
        if hp.rope_freq_factors:  # Llama 3.1/3.2: each pair's frequency divided by its factor
            theta = theta / np.asarray(hp.rope_freq_factors, dtype=np.float64)
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        out = x.copy()
        if hp.rope_type == "neox":  # dim i pairs with i + nr/2
            x0, x1 = x[..., : nr // 2], x[..., nr // 2 : nr]
            out[..., : nr // 2] = x0 * c - x1 * s
            out[..., nr // 2 : nr] = x0 * s + x1 * c
        else:  # adjacent pairs
            x0, x1 = x[..., 0:nr:2], x[..., 1:nr:2]
            out[..., 0:nr:2] = x0 * c - x1 * s
            out[..., 1:nr:2] = x0 * s + x1 * c
        return out

    def _proj(self, x: F64, p: str, name: str, heads: int) -> F64:
        """x @ W^T (+ bias), as [T, heads, hd], RMS-normed per head when the recipe says so."""
        hp, w = self.hp, self.w
        y = self._mm(x, p + name + ".weight")
        if hp.attn_qkv_bias:
            y = y + w[p + name + ".bias"]
        y = y.reshape(len(x), heads, hp.key_length)
        if hp.attn_qk_norm and name in ("attn_q", "attn_k"):
            y = self._rms(y, w[p + name + "_norm.weight"])
        return y

    def _mm(self, x: F64, name: str) -> F64:
        """x @ W^T, the activations rounded to Q8 first where the CPU kernels do that (and the
        operands to the GEMM's type in a Vulkan prompt chunk, with `gemm`)."""
        w = self.w[name]
        if self.gemm and len(x) > 1 and name != self.head:  # a prompt chunk's GEMM
            if self.gemm == "f16":
                x, w = (np.asarray(np.clip(a, -65504, 65504).astype(np.float16), dtype=np.float64) for a in (x, w))
            return np.asarray(x @ w.T)
        if self.q8_activations and name in self.q8_weights:
            x = q8_round(x)
        return np.asarray(x @ w.T)

    def _attention(self, q: F64, kall: F64, vall: F64, start: int, il: int) -> F64:
        hp = self.hp
        t, nh, nkv, hd = len(q), hp.head_count, hp.head_count_kv, hp.key_length
        qg = q.reshape(t, nkv, nh // nkv, hd)
        scores = np.einsum("tkgd,skd->kgts", qg, kall) * hp.q_scale()
        kpos = np.arange(start + t)[None, :]
        qpos = (start + np.arange(t))[:, None]
        mask = kpos > qpos  # [T, S]
        if hp.window(il):
            mask |= qpos - kpos >= hp.window(il)
        scores = np.where(mask, -np.inf, scores)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        return np.asarray(np.einsum("kgts,skd->tkgd", scores, vall).reshape(t, nh * hd))

    def _stored(self, rows: F64) -> F64:
        """K or V rows as the KV cache keeps them."""
        return np.asarray(rows.astype(np.float32).astype(np.float16), dtype=np.float64) if self.kv_f16 else rows

    def forward(self, ids: list[int]) -> F64:
        """Run `ids` after what is already cached; returns the logits of every new position [T, V]."""
        hp = self.hp
        logits = self._mm(self.hidden(ids), self.head)
        if hp.final_logit_softcapping:
            cap = hp.final_logit_softcapping
            logits = cap * np.tanh(logits / cap)
        return np.asarray(logits)

    def hidden(self, ids: list[int]) -> F64:
        """Run `ids` after what is already cached; returns the final hidden states of every new
        position after output_norm [T, d] (what an embedding model pools)."""
        hp, w = self.hp, self.w
        start = self.k.shape[1]
        pos = np.arange(start, start + len(ids), dtype=np.float64)
        x = w["token_embd.weight"][ids] * hp.embedding_scale  # [T, d]
        ks, vs = [], []
        for il in range(hp.block_count):
            p = f"blk.{il}."
            cur = self._rms(x, w[p + "attn_norm.weight"])
            q = self._rope(self._proj(cur, p, "attn_q", hp.head_count), pos, il)
            k = self._stored(self._rope(self._proj(cur, p, "attn_k", hp.head_count_kv), pos, il))
            v = self._stored(self._proj(cur, p, "attn_v", hp.head_count_kv))
            ks.append(np.concatenate([self.k[il], k]))  # [S, nkv, hd]
            vs.append(np.concatenate([self.v[il], v]))
            att = self._mm(self._attention(q, ks[-1], vs[-1], start, il), p + "attn_output.weight")
            if hp.post_norms:
                att = self._rms(att, w[p + "post_attention_norm.weight"])
            x = x + att
            cur = self._rms(x, w[p + "ffn_norm.weight"])
            gate = self._mm(cur, p + "ffn_gate.weight")
            act = gelu_tanh(gate) if hp.ffn_activation == "gelu" else silu(gate)
            ffn = self._mm(act * self._mm(cur, p + "ffn_up.weight"), p + "ffn_down.weight")
            if hp.post_norms:
                ffn = self._rms(ffn, w[p + "post_ffw_norm.weight"])
            x = x + ffn
        self.k, self.v = np.stack(ks), np.stack(vs)
        return self._rms(x, w["output_norm.weight"])
