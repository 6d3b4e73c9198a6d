"""A model session: one compiled artifact, its GGUF weights and its paged KV cache on one device.

Owns: `ModelSession` — opens an artifact (checking its manifest against the GGUF, the device and,
on the CPU, this CPU's features: zinc.runtime.cpu_flags; and, before mapping or allocating anything, that its weights, KV slab and working buffers fit in
the memory available: `memory_needed`, zinc.runtime.memory), allocates the KV slab on the device
once (`kv_slots` rows, slot-major; slot 0 is zeroed scratch that padding rows point at), and runs
steps as one step call plus one in-place `kv_write` call (enqueued without waiting: the device
runs a module's calls in order, zinc.runtime.invoke): `prefill_slots` (a prompt of one sequence,
split into chunks of `chunk_tokens` (zinc.artifact.prefill_rows); all but the last run `prefill_kv`, which has no output head), `prefill_rows` (a
prompt's earlier part, K/V only), `prefill_packed` (the last chunks of several prompts in one
call, CPU artifacts), `decode_batch` (one token for each of up to max(batch_sizes) sequences,
padded to a compiled bucket; it returns once enqueued, and reading the step waits for it) and
`decode_next` (the step after one of those, fed its greedy tokens on the device, so it can be
enqueued before that one is read), each given the slots of the positions it reads and writes;
`prefill` / `decode` / `decode_after` (`decode_next`'s single-sequence form) are the
single-sequence forms with slot = position; `embed` (pooling models' artifacts) returns a whole input's final hidden states from one call that neither reads nor writes
the slab, `embed_packed` those of several short inputs from one call (CPU artifacts); `warm_up` runs one prefill and one decode step before a server says it is ready. Only the greedy tokens
(4 bytes each) cross back to the host unless the caller asks for logits. `layer_major` puts rows
held in the slab's order into kv_write's ([L, 2, T, Hkv, hd]).
Imports: iree.runtime (through zinc.runtime.module/device), numpy, zinc.artifact, zinc.model,
zinc.errors, zinc.runtime.{memory, cpu_flags}.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zinc.artifact import CTX_ALIGN, KV_DTYPES, Manifest, kv_storage, load_manifest
from zinc.artifact import prefill_rows as tokens_per_call  # not ModelSession.prefill_rows
from zinc.errors import ArtifactError, ContextLengthExceededError, InvalidRequestError
from zinc.model.gguf_file import GGUFModel, open_gguf
from zinc.model.hparams import HParams, describe
from zinc.runtime import memory
from zinc.runtime.cpu_flags import check_cpu_features
from zinc.runtime.device import DeviceSpec, to_host
from zinc.runtime.memory import MemoryNeed, check_memory
from zinc.runtime.module import ELEMENT_TYPES, LoadedModule

DEFAULT_CONTEXT = 2048
_CPU_FLAG = "--iree-llvmcpu-target-cpu="  # the manifest's flag naming the CPU target
SCRATCH_SLOTS = 64
EMBED_PACK_TOKENS = 256  # tokens of one packed embedding call, all its inputs together


DEFAULT_BATCH = 8  # the largest decode bucket `zinc compile` builds by default


def slab_geometry(hp: HParams, context_length: int | None, kv_slots: int | None) -> tuple[int, int]:
    """A session's context length (`context_length`, default `DEFAULT_CONTEXT`, at most the
    model's) and KV slab slots (at least a whole context plus a scratch page: slot 0 is scratch;
    pages of up to 64 slots)."""
    context = min(context_length or DEFAULT_CONTEXT, hp.context_length)
    return context, max(kv_slots or 0, context + SCRATCH_SLOTS)


def memory_needed(
    gguf: GGUFModel,
    target: str,
    context_length: int | None = None,
    kv_slots: int | None = None,
    artifact_dir: Path | None = None,
    manifest: Manifest | None = None,
) -> MemoryNeed:
    """What a session of `gguf` on `target` takes in memory (zinc.runtime.memory): with its
    artifact (`artifact_dir` and its `manifest`), the weights it binds, its KV slab and working
    buffers; before it is compiled, the same from the GGUF alone (every tensor as its weights,
    the default decode buckets), which is no more than the compiled figure."""
    hp = manifest.hparams if manifest is not None else describe(gguf).hparams
    context, slots = slab_geometry(hp, context_length, kv_slots)
    archives = [artifact_dir / a for a in manifest.parameter_archives] if manifest and artifact_dir else []
    dtype = manifest.kv_cache.dtype if manifest is not None else memory.KV_DTYPE.get(target, "f16")
    rows = max(manifest.batch_sizes) if manifest is not None else DEFAULT_BATCH
    vmfb = (artifact_dir / manifest.vmfb).stat().st_size if manifest and artifact_dir else 0
    chunk = tokens_per_call(target, hp)
    return MemoryNeed(
        weights=memory.weights_bytes(gguf, archives),
        kv_cache=slots * memory.kv_slot_bytes(hp, dtype),
        working=vmfb + memory.working_bytes(hp, context, chunk, rows),
    )


def _prefill_ctx(where: np.ndarray[Any, np.dtype[np.int32]], at: int, n: int) -> np.ndarray[Any, np.dtype[np.int32]]:
    """A prefill's ctx for `n` tokens at positions at..: the slots of the positions before `at`, then
    scratch slot 0 (this call's own rows go there, then padding), CTX_ALIGN-padded."""
    ctx = np.zeros(-(-(at + n) // CTX_ALIGN) * CTX_ALIGN, np.int32)
    ctx[:at] = where[:at]
    return ctx


def layer_major(rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """K/V rows in the slab's order [T, L, 2, Hkv, hd] as `kv_write` takes them: [L, 2, T, Hkv, hd]."""
    return np.ascontiguousarray(rows.transpose(1, 2, 0, 3, 4))


def _finished() -> None:
    """The wait of a step whose call was already waited for."""


@dataclass
class StepResult:
    """The outcome of one step: the greedy token, and the logits on request (device-resident)."""

    _session: ModelSession
    _token: Any
    _logits: Any
    _wait: Callable[[], None] = _finished

    @property
    def token(self) -> int:
        self._wait()
        return int(to_host(self._token, self._session.device)[0])

    def logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        self._wait()
        return np.asarray(to_host(self._logits, self._session.device)[0], dtype=np.float32)


@dataclass
class BatchStepResult:
    """The outcome of one batched decode step; row i is the i-th sequence given. The call may
    still be running on the device: `wait` (or reading a row) waits for it."""

    _session: ModelSession
    _tokens: Any
    _logits: Any
    _wait: Callable[[], None] = _finished
    bucket: int = 0  # the compiled batch size it ran in
    _host_tokens: np.ndarray[Any, np.dtype[np.int32]] | None = None
    _host_logits: np.ndarray[Any, np.dtype[np.float32]] | None = None

    def wait(self) -> None:
        """Until the step has run (raises if it failed on the device); then it is free to repeat."""
        self._wait()
        self._wait = _finished

    def token(self, i: int) -> int:
        if self._host_tokens is None:
            self.wait()
            self._host_tokens = np.asarray(to_host(self._tokens, self._session.device), dtype=np.int32)
        return int(self._host_tokens[i])

    def logits(self, i: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        if self._host_logits is None:
            self.wait()
            self._host_logits = np.asarray(to_host(self._logits, self._session.device), dtype=np.float32)
        row: np.ndarray[Any, np.dtype[np.float32]] = self._host_logits[i]
        return row


Slots = np.ndarray[Any, np.dtype[np.int32]]


class ModelSession:
    def __init__(
        self,
        artifact_dir: Path,
        gguf_path: Path,
        device: DeviceSpec,
        context_length: int | None = None,
        kv_slots: int | None = None,
    ):
        gguf = open_gguf(gguf_path)
        self.manifest: Manifest = load_manifest(artifact_dir, gguf)
        if self.manifest.target != device.target:
            raise ArtifactError(
                f"{artifact_dir} was compiled for {self.manifest.target}, not for the {device.target} device"
            )
        if device.target == "cpu":  # an artifact built elsewhere must not use what this CPU lacks
            cpu = self.manifest.flag(_CPU_FLAG, "host")
            check_cpu_features(self.manifest.cpu_features, str(artifact_dir), cpu)
        self.weights_bytes = sum(t.n_bytes for t in gguf.tensors.values())
        hp = self.manifest.hparams
        self.hparams = hp
        self.device_spec = device
        self.context_length, self.kv_slots = slab_geometry(hp, context_length, kv_slots)
        need = memory_needed(gguf, device.target, context_length, kv_slots, artifact_dir, self.manifest)
        check_memory(need, gguf.path.stem)  # before anything is mapped or allocated
        self.batch_sizes = tuple(sorted(self.manifest.batch_sizes))
        self.chunk_tokens = tokens_per_call(self.manifest.target, hp)  # prompt tokens per prefill call
        self.module = LoadedModule(
            artifact_dir / self.manifest.vmfb,
            device.uri,
            parameter_files=[gguf.path, *(artifact_dir / a for a in self.manifest.parameter_archives)],
            threads=device.threads,
        )
        self.device = self.module.device
        self._prefill = self.module.fn("prefill")
        self._prefill_kv = self.module.fn("prefill_kv")
        self._decode = {b: self.module.fn(f"decode_b{b}") for b in self.batch_sizes}
        entries = set(self.manifest.entry_points)
        self._packed = {b: self.module.fn(f"prefill_x{b}") for b in self.batch_sizes if f"prefill_x{b}" in entries}
        self._kv_write = self.module.fn("kv_write")
        self._embed = self.module.fn("embed") if "embed" in entries else None
        self._embed_packed = {b: self.module.fn(f"embed_x{b}") for b in self.batch_sizes if f"embed_x{b}" in entries}
        # f16 on the CPU; "f16x2" on Vulkan: f16 values two to an i32 word, rows of key_length / 2 words
        self.kv_dtype = self.manifest.kv_cache.dtype
        self.kv_storage, width = kv_storage(self.kv_dtype, hp.key_length)
        if self.kv_dtype not in KV_DTYPES or self.kv_storage not in ELEMENT_TYPES:
            raise ArtifactError(f"{artifact_dir}: KV cache type {self.kv_dtype!r} is not supported")
        self.row_shape = (hp.block_count, 2, hp.head_count_kv, width)
        self.cache = self.module.empty((self.kv_slots, *self.row_shape), self.kv_storage)  # only written slots are read
        # padding reads scratch slot 0: keep it finite (all-zero words are two f16 zeros)
        zero = layer_major(np.zeros((1, *self.row_shape), ELEMENT_TYPES[self.kv_storage][0]))
        self._kv_write(self.cache, self.module.to_device(zero), self.module.to_device(np.zeros(1, np.int32)))

    def warm_up(self) -> None:
        """One prefill and one decode step (in slots 1 and 2, which a request writes before it
        reads them): the first request then finds the weights paged in and every dispatch
        initialised, so a server reports ready only when it answers at full speed."""
        token = self.prefill([0], 0).token
        _ = self.decode(token, 1).token

    @property
    def vocab_size(self) -> int:
        return self.hparams.vocab_size

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    @property
    def max_packed(self) -> int:
        """The most prompts one `prefill_packed` call takes (0: the artifact has no packed entry)."""
        return max(self._packed, default=0)

    @property
    def packed_tokens(self) -> int:
        """The most tokens one `prefill_packed` call takes, all its prompts together."""
        return self.chunk_tokens

    @property
    def embeds(self) -> bool:
        """Whether the artifact has `embed` (its GGUF declares a mean, cls or last pooling)."""
        return self._embed is not None

    def embed(self, ids: Sequence[int]) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The final hidden states [T, d] (after output_norm) of `ids` at positions 0.., in one
        call that neither reads nor writes the KV slab."""
        if self._embed is None:
            raise InvalidRequestError("this model declares no pooling (GGUF {arch}.pooling_type): it has no embeddings")
        arr = self._check(ids, 0)
        hidden = self._embed(self.module.to_device(arr))
        return np.asarray(to_host(hidden, self.device), dtype=np.float32)

    @property
    def max_embed_packed(self) -> int:
        """The most inputs one `embed_packed` call takes (0: the artifact has no packed `embed`)."""
        return max(self._embed_packed, default=0)

    def embed_packed(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray[Any, np.dtype[np.float32]]]:
        """`embed` of 2 to `max_embed_packed` inputs, `EMBED_PACK_TOKENS` at most in all, in one
        call (`embed_x{N}`, CPU artifacts): each input's hidden states [T_i, d] are bit for bit
        those of `embed` on it alone."""
        n = len(inputs)
        if not 2 <= n <= self.max_embed_packed:
            raise InvalidRequestError(f"a packed embedding holds 2 to {self.max_embed_packed} inputs")
        arrs = [self._check(ids, 0) for ids in inputs]
        sizes = [a.size for a in arrs]
        if sum(sizes) > EMBED_PACK_TOKENS:
            raise InvalidRequestError(f"a packed embedding holds at most {EMBED_PACK_TOKENS} tokens", param="input")
        bucket = next(b for b in sorted(self._embed_packed) if b >= n)
        pad = [np.zeros(1, np.int32)] * (bucket - n)  # padding inputs: one token at position 0
        offs = np.cumsum([0, *sizes, *(1 for _ in pad)])
        args = [int(v) for i in range(bucket) for v in (offs[i], offs[i + 1] - offs[i])]
        ids = np.concatenate([*arrs, *pad])
        pos = np.concatenate([np.arange(k, dtype=np.int32) for k in sizes] + pad)
        hidden = self._embed_packed[bucket](self.module.to_device(ids), self.module.to_device(pos), *args)
        rows = np.asarray(to_host(hidden, self.device), dtype=np.float32)
        return [rows[offs[i] : offs[i + 1]] for i in range(n)]

    def kv_cache_bytes(self) -> int:
        return self.kv_slots * int(np.prod(self.row_shape)) * ELEMENT_TYPES[self.kv_storage][0].itemsize

    def _check(self, ids: Sequence[int], start: int) -> np.ndarray[Any, np.dtype[np.int32]]:
        arr = np.asarray(ids, dtype=np.int64)
        if arr.ndim != 1 or arr.size == 0:
            raise InvalidRequestError("a step needs at least one token id")
        if arr.min() < 0 or arr.max() >= self.vocab_size:
            raise InvalidRequestError(f"token ids must be in [0, {self.vocab_size})", param="prompt")
        if start < 0 or start + arr.size > self.context_length:
            raise ContextLengthExceededError(start + int(arr.size), self.context_length)
        return arr.astype(np.int32)

    def _slots(self, slots: Slots | Sequence[int], n: int) -> Slots:
        arr = np.asarray(slots, dtype=np.int32)
        if arr.shape != (n,) or (n and (arr.min() < 0 or arr.max() >= self.kv_slots)):
            raise InvalidRequestError(f"a sequence needs {n} slots in [0, {self.kv_slots})")
        return arr

    def prefill_slots(self, ids: Sequence[int], start: int, slots: Slots | Sequence[int]) -> StepResult:
        """Run `ids` of one sequence at positions start..; `slots[p]` is position p's slot."""
        arr = self._check(ids, start)
        where = self._slots(slots, start + arr.size)
        size = self.chunk_tokens
        last = (arr.size - 1) // size * size  # the last chunk's offset: only it needs the head
        self._store_rows(arr[:last], start, where)
        _, logits, token = self._chunk(arr[last:], start + last, where, rows_only=False)
        return StepResult(self, token, logits)

    def prefill_rows(self, ids: Sequence[int], start: int, slots: Slots | Sequence[int]) -> None:
        """Store the K/V rows of `ids` at positions start.. (a prompt's earlier part: no logits)."""
        arr = self._check(ids, start)
        self._store_rows(arr, start, self._slots(slots, start + arr.size))

    def _store_rows(self, arr: np.ndarray[Any, np.dtype[np.int32]], start: int, where: Slots) -> None:
        """`prefill_kv` calls of at most one chunk each over `arr`, at positions start.."""
        size = self.chunk_tokens
        for off in range(0, arr.size, size):
            self._chunk(arr[off : off + size], start + off, where, rows_only=True)

    def _chunk(self, chunk: np.ndarray[Any, np.dtype[np.int32]], at: int, where: Slots, rows_only: bool) -> Any:
        """One prefill call at positions at.. and its kv_write; the call's results."""
        args = (self.cache, self.module.to_device(chunk), at, self.module.to_device(_prefill_ctx(where, at, chunk.size)))
        out = (self._prefill_kv(*args),) if rows_only else self._prefill(*args)
        self._kv_write.submit(self.cache, out[0], self.module.to_device(where[at : at + chunk.size]))
        return out

    def prefill_packed(self, jobs: Sequence[tuple[Sequence[int], int, Slots | Sequence[int]]]) -> BatchStepResult:
        """The last chunks of 2 to `max_packed` prompts in one call, `packed_tokens` at most in all:
        job i is (ids, start, slots) as for `prefill_slots`, and row i of the result its next
        token. Each row's K/V and logits are bit for bit those of `prefill_slots` on its own."""
        n = len(jobs)
        if not 2 <= n <= self.max_packed:
            raise InvalidRequestError(f"a packed prefill holds 2 to {self.max_packed} prompts")
        bucket = next(b for b in sorted(self._packed) if b >= n)
        to_dev = self.module.to_device
        ids: list[Slots] = []  # each prompt's ids, positions and slots written: int32 arrays
        pos: list[Slots] = []
        write: list[Slots] = []
        args: list[Any] = []  # per prompt: offset, length, start, ctx
        off = 0
        for chunk, start, slots in jobs:
            arr = self._check(chunk, start)
            where = self._slots(slots, start + arr.size)
            args += [off, arr.size, start, to_dev(_prefill_ctx(where, start, arr.size))]
            off += arr.size
            ids.append(arr)
            pos.append(np.arange(start, start + arr.size, dtype=np.int32))
            write.append(where[start:])
        if off > self.packed_tokens:
            raise InvalidRequestError(f"a packed prefill holds at most {self.packed_tokens} tokens")
        for i in range(bucket - n):  # padding: one token at position 0, its rows written to scratch slot 0
            args += [off + i, 1, 0, to_dev(np.zeros(CTX_ALIGN, np.int32))]
            ids.append(np.zeros(1, np.int32))
            pos.append(np.zeros(1, np.int32))
            write.append(np.zeros(1, np.int32))
        call = self._packed[bucket]
        (rows, logits, toks), wait = call.start(self.cache, to_dev(np.concatenate(ids)), to_dev(np.concatenate(pos)), *args)
        self._kv_write.submit(self.cache, rows, to_dev(np.concatenate(write)))
        return BatchStepResult(self, toks, logits, wait, bucket)

    def decode_batch(
        self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[Slots | Sequence[int]]
    ) -> BatchStepResult:
        """One token for each of B sequences: row i is `tokens[i]` at `positions[i]`, and
        `slots[i]` the slots of its positions 0..positions[i] (the last one is written). Returns
        once the step is enqueued; reading it waits for the device."""
        n = len(tokens)
        if not 1 <= n <= self.max_batch or len(positions) != n or len(slots) != n:
            raise InvalidRequestError(f"a decode batch holds 1 to {self.max_batch} sequences")
        bucket = next(b for b in self.batch_sizes if b >= n)
        ids = np.zeros(bucket, np.int32)
        ids[:n] = self._check(tokens, 0)
        return self._step(self.module.to_device(ids), bucket, positions, slots)

    def decode_next(
        self, prev: BatchStepResult, positions: Sequence[int], slots: Sequence[Slots | Sequence[int]]
    ) -> BatchStepResult:
        """The step after `prev` for the same rows, each fed its greedy token of `prev` straight
        from the device: it can be enqueued before `prev` has run (the device runs it after)."""
        if len(positions) > prev.bucket or len(slots) != len(positions):
            raise InvalidRequestError("a chained step holds the rows of the step before it")
        return self._step(prev._tokens, prev.bucket, positions, slots)

    def _step(
        self, ids: Any, bucket: int, positions: Sequence[int], slots: Sequence[Slots | Sequence[int]]
    ) -> BatchStepResult:
        """One decode call of `bucket` rows (the first len(positions) real) and its kv_write."""
        for p in positions:
            if not 0 <= p < self.context_length:
                raise ContextLengthExceededError(p + 1, self.context_length)
        pos = np.zeros(bucket, np.int32)
        pos[: len(positions)] = positions
        width = -(-max(1, *positions) // CTX_ALIGN) * CTX_ALIGN  # the longest cached part, rounded up
        ctx = np.zeros((bucket, width), np.int32)  # padding points at scratch slot 0
        write = np.zeros(bucket, np.int32)
        for i, (p, own) in enumerate(zip(positions, slots, strict=True)):
            if len(own) != p + 1:
                raise InvalidRequestError(f"a sequence at position {p} needs {p + 1} slots")
            ctx[i, :p] = own[:p]
            write[i] = own[p]
        if min(ctx.min(), write.min()) < 0 or max(ctx.max(), write.max()) >= self.kv_slots:  # one check for all rows
            raise InvalidRequestError(f"slots must be in [0, {self.kv_slots})")
        to_dev = self.module.to_device
        (rows, logits, toks), wait = self._decode[bucket].start(self.cache, ids, to_dev(pos), to_dev(ctx))
        self._kv_write.submit(self.cache, rows, to_dev(write))  # the next call waits for it on the device
        return BatchStepResult(self, toks, logits, wait, bucket)

    def _own_slots(self, n: int) -> Slots:
        """The single-sequence slots: position p in slot p + 1 (slot 0 is scratch)."""
        return np.arange(1, n + 1, dtype=np.int32)

    def prefill(self, ids: Sequence[int], start: int = 0) -> StepResult:
        """Run the prompt `ids` at positions start.. and return the last position's step."""
        return self.prefill_slots(ids, start, self._own_slots(start + len(ids)))

    def decode(self, token: int, pos: int) -> StepResult:
        """Run one token at position `pos` (the number of tokens already in the cache)."""
        step = self.decode_batch([token], [pos], [self._own_slots(pos + 1)])
        return StepResult(self, step._tokens, step._logits, step.wait)

    def decode_after(self, prev: StepResult, pos: int) -> StepResult:
        """The step at `pos` fed the greedy token of `prev` (a step of `decode` or `decode_after`)
        straight from the device: it can be enqueued before `prev` has run, so the host's work
        for a token overlaps the device's step (as the server's chained batches do)."""
        step = self._step(prev._token, self.batch_sizes[0], [pos], [self._own_slots(pos + 1)])
        return StepResult(self, step._tokens, step._logits, step.wait)
