"""A numpy reference forward pass (float64) for the architectures zinc compiles: the test oracle.

Owns: `ReferenceModel`, which dequantizes GGUF weights with `gguf.quants.dequantize` and runs the
same math as the compiled graph, written plainly (llama2.c's `forward`, in numpy), one token
block at a time with its own KV cache. Slow by design; used by tests and for debugging.
Imports: numpy, gguf, zinc.model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from zinc.model.gguf_file import GGUFModel
from zinc.model.hparams import describe

F64 = np.ndarray[Any, np.dtype[np.float64]]


class ReferenceModel:
    def __init__(self, model: GGUFModel) -> None:
        self.hp = describe(model).hparams
        reader = GGUFReader(model.path, "r")
        self.w: dict[str, F64] = {}
        for t in reader.tensors:
            arr = dequantize(t.data, t.tensor_type).astype(np.float64)
            self.w[t.name] = arr.reshape([int(x) for x in reversed(t.shape)])  # [ne1, ne0]
        hp = self.hp
        self.k = np.zeros((hp.block_count, 0, hp.head_count_kv, hp.key_length))
        self.v = np.zeros_like(self.k)

    def reset(self) -> None:
        self.k = self.k[:, :0]
        self.v = self.v[:, :0]

    def _rms(self, x: F64, w: F64) -> F64:
        return np.asarray(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.hp.layer_norm_rms_epsilon) * w)

    def _rope(self, x: F64, pos: np.ndarray[Any, Any]) -> F64:  # x [T, H, hd], adjacent pairs
        nr = self.hp.rope_dimension_count
        i = np.arange(nr // 2)
        theta = pos[:, None] * self.hp.rope_freq_base ** (-2.0 * i / nr)  # [T, nr/2]
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        out = x.copy()
        x0, x1 = x[..., 0:nr:2], x[..., 1:nr:2]
        out[..., 0:nr:2] = x0 * c - x1 * s
        out[..., 1:nr:2] = x0 * s + x1 * c
        return out

    def forward(self, ids: list[int]) -> F64:
        """Run `ids` after what is already cached; returns the logits of every new position [T, V]."""
        hp, w = self.hp, self.w
        nh, nkv, hd = hp.head_count, hp.head_count_kv, hp.key_length
        start, t = self.k.shape[1], len(ids)
        pos = np.arange(start, start + t, dtype=np.float64)
        x = w["token_embd.weight"][ids]  # [T, d]
        ks, vs = [], []
        for il in range(hp.block_count):
            p = f"blk.{il}."
            cur = self._rms(x, w[p + "attn_norm.weight"])
            q = self._rope((cur @ w[p + "attn_q.weight"].T).reshape(t, nh, hd), pos)
            k = self._rope((cur @ w[p + "attn_k.weight"].T).reshape(t, nkv, hd), pos)
            v = (cur @ w[p + "attn_v.weight"].T).reshape(t, nkv, hd)
            kall = np.concatenate([self.k[il], k])  # [S, nkv, hd]
            vall = np.concatenate([self.v[il], v])
            ks.append(kall)
            vs.append(vall)
            g = nh // nkv
            qg = q.reshape(t, nkv, g, hd)
            scores = np.einsum("tkgd,skd->kgts", qg, kall) / np.sqrt(hd)
            mask = np.arange(start + t)[None, :] > (start + np.arange(t))[:, None]  # [T, S]
            scores = np.where(mask, -np.inf, scores)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            att = np.einsum("kgts,skd->tkgd", scores, vall).reshape(t, nh * hd)
            x = x + att @ w[p + "attn_output.weight"].T
            cur = self._rms(x, w[p + "ffn_norm.weight"])
            gate = cur @ w[p + "ffn_gate.weight"].T
            up = cur @ w[p + "ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
        self.k, self.v = np.stack(ks), np.stack(vs)
        out = w["token_embd.weight"] if hp.tied_output else w["output.weight"]
        return np.asarray(self._rms(x, w["output_norm.weight"]) @ out.T)
