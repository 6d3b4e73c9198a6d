"""A model session: one compiled artifact, its GGUF weights and its KV cache on one device.

Owns: `ModelSession` — opens an artifact (checking its manifest against the GGUF and the device),
allocates the KV slab on the device once, and runs `prefill` (a prompt, split into chunks) and
`decode` (one token) as one step call plus one in-place `kv_write` call each. Only the greedy
token (4 bytes) crosses back to the host unless the caller asks for the logits.
Imports: iree.runtime (through zinc.runtime.module/device), numpy, zinc.artifact, zinc.model, zinc.errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zinc.artifact import Manifest, load_manifest
from zinc.errors import ArtifactError, ContextLengthExceededError, InvalidRequestError
from zinc.model.gguf_file import open_gguf
from zinc.runtime.device import DeviceSpec, to_host
from zinc.runtime.module import LoadedModule

DEFAULT_CONTEXT = 2048
# Tokens per prefill call, per target. It bounds the attention scores' memory; on Vulkan it is 8
# because IREE 3.13's SPIR-V code for the attention softmax over a dynamic token count above 8
# computes wrong values (checked on lavapipe: T <= 8 exact, T = 9 off; tests/model covers it).
PREFILL_CHUNK = {"cpu": 256, "vulkan": 8}


@dataclass
class StepResult:
    """The outcome of one step: the greedy token, and the logits on request (device-resident)."""

    _session: ModelSession
    _token: Any
    _logits: Any

    @property
    def token(self) -> int:
        return int(to_host(self._token, self._session.device)[0])

    def logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        return np.asarray(to_host(self._logits, self._session.device)[0], dtype=np.float32)


class ModelSession:
    def __init__(
        self, artifact_dir: Path, gguf_path: Path, device: DeviceSpec, context_length: int | None = None
    ):
        gguf = open_gguf(gguf_path)
        self.manifest: Manifest = load_manifest(artifact_dir, gguf)
        if self.manifest.target != device.target:
            raise ArtifactError(
                f"{artifact_dir} was compiled for {self.manifest.target}, not for the {device.target} device"
            )
        self.weights_bytes = sum(t.n_bytes for t in gguf.tensors.values())
        hp = self.manifest.hparams
        self.hparams = hp
        self.device_spec = device
        self.context_length = min(context_length or DEFAULT_CONTEXT, hp.context_length)
        self.module = LoadedModule(
            artifact_dir / self.manifest.vmfb,
            device.uri,
            parameter_files=[gguf.path, *(artifact_dir / a for a in self.manifest.parameter_archives)],
        )
        self.device = self.module.device
        self._prefill = self.module.fn("prefill")
        self._decode = self.module.fn("decode")
        self._kv_write = self.module.fn("kv_write")
        shape = (hp.block_count, 2, self.context_length, hp.head_count_kv, hp.key_length)
        self.cache = self.module.empty_f32(shape)  # [L, 2, S, Hkv, hd]; rows [0, pos) are ever read

    @property
    def vocab_size(self) -> int:
        return self.hparams.vocab_size

    def kv_cache_bytes(self) -> int:
        hp = self.hparams
        return hp.block_count * 2 * self.context_length * hp.head_count_kv * hp.key_length * 4

    def _check(self, ids: Sequence[int], start: int) -> np.ndarray[Any, np.dtype[np.int32]]:
        arr = np.asarray(ids, dtype=np.int64)
        if arr.ndim != 1 or arr.size == 0:
            raise InvalidRequestError("a step needs at least one token id")
        if arr.min() < 0 or arr.max() >= self.vocab_size:
            raise InvalidRequestError(f"token ids must be in [0, {self.vocab_size})", param="prompt")
        if start < 0 or start + arr.size > self.context_length:
            raise ContextLengthExceededError(start + int(arr.size), self.context_length)
        return arr.astype(np.int32)

    def prefill(self, ids: Sequence[int], start: int = 0) -> StepResult:
        """Run the prompt `ids` at positions start.. and return the last position's step."""
        arr = self._check(ids, start)
        result = None
        size = PREFILL_CHUNK[self.manifest.target]
        for off in range(0, arr.size, size):
            chunk = arr[off : off + size]
            rows, logits, token = self._prefill(self.cache, self.module.to_device(chunk), start + off)
            self._kv_write(self.cache, rows, start + off)
            result = StepResult(self, token, logits)
        assert result is not None
        return result

    def decode(self, token: int, pos: int) -> StepResult:
        """Run one token at position `pos` (the number of tokens already in the cache)."""
        arr = self._check([token], pos)
        rows, logits, tok = self._decode(self.cache, self.module.to_device(arr), pos)
        self._kv_write(self.cache, rows, pos)
        return StepResult(self, tok, logits)
