"""A fake `StepModel` for the scheduler tests (test_batcher.py, test_scheduler.py).

Each slot of its slab holds the whole token history that ends at it, so a read checks that every
earlier position of the sequence is its own (a slot another sequence overwrote, a wrong page table
or a lost row fails the call); the greedy token is a hash of that history, so tokens equal `solo`
only when every position was read back right. Every call is recorded (kind, rows, positions, slots
written); a call can be held (`hold_at`) so a test sees the loop between two steps, slowed
(`delay`) or made to fail (`fail_prefill`, `fail_on`); `ahead` counts the decode steps made and
not yet read back. With `step_s` the calls run on an in-order device, `step_s` each: a decode step
returns at once and is read back once it has run, a prompt's call returns once it has run; `ran`
holds when each started there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zinc.errors import ZincError

VOCAB = 100
PAGE = 16
WAIT_S = 10.0


def next_token(history: Sequence[int]) -> int:
    return sum((t + 1) * (i + 3) for i, t in enumerate(history)) % 97 + 2  # never 0 or 1


def solo(prompt: Sequence[int], n: int) -> list[int]:
    history, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(history))
        history.append(out[-1])
    return out


def prompt(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(2, VOCAB, n)]


@dataclass
class Call:
    kind: str  # "prefill", "rows" (a prompt's earlier chunk, no token), "packed" (several prompts) or "decode"
    tokens: list[int]
    positions: list[int]  # prefill: the chunk's positions; decode: one per row
    written: list[int]  # the slot of each new row


@dataclass
class Row:
    token: int

    def logits(self) -> np.ndarray:
        row = np.zeros(VOCAB, np.float32)
        row[self.token] = 1.0
        return row


@dataclass
class Rows:
    tokens: list[int]
    model: FakeModel | None = None  # told when the step is read back (`FakeModel.ahead`)
    ready_at: float = 0.0  # when the step has run on the fake's in-order device (`step_s`)

    def wait(self) -> None:
        if self.model is not None:
            self.model.ahead -= 1
            self.model = None
        time.sleep(max(0.0, self.ready_at - time.monotonic()))

    def token(self, i: int) -> int:
        return self.tokens[i]

    def logits(self, i: int) -> np.ndarray:
        return Row(self.tokens[i]).logits()


@dataclass
class FakeModel:
    context_length: int = 64
    kv_slots: int = PAGE * 24
    max_batch: int = 4
    max_packed: int = 0  # prompts per `prefill_packed` call (0: the model packs none)
    packed_tokens: int = 32
    fail_prefill: Callable[[list[int]], bool] = lambda ids: False
    fail_on: int | None = None  # a decode input token that raises
    delay: float = 0.0  # seconds per call
    slab: dict[int, tuple[int, ...]] = field(default_factory=dict)  # slot -> history ending there
    calls: list[Call] = field(default_factory=list)
    hold_at: int | None = None  # the call with this index waits (inside set) until `go` is set
    inside: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    ahead: int = 0  # decode steps made and not yet read back (waited for)
    most_ahead: int = 0
    step_s: float = 0.0  # device time of every call, run one after another in call order (0: none)
    free_at: float = 0.0  # when the device is done with the calls made so far
    ran: list[tuple[Call, float]] = field(default_factory=list)  # each call and its device start

    def _device(self) -> float:
        """Put the call just recorded on the in-order device; returns when it has run."""
        if not self.step_s:
            return 0.0
        start = max(time.monotonic(), self.free_at)
        self.free_at = start + self.step_s
        self.ran.append((self.calls[-1], start))
        return self.free_at

    def _gate(self) -> None:
        time.sleep(self.delay)
        if self.hold_at is not None and len(self.calls) == self.hold_at:
            self.hold_at = None
            self.inside.set()
            assert self.go.wait(WAIT_S), "the test never let the model go on"

    def _read(self, slots: Any, n: int) -> list[int]:
        history: list[int] = []
        for p in range(n):
            slot = int(slots[p])
            assert slot >= PAGE, "page 0 is scratch"
            held = self.slab.get(slot)
            assert held is not None and list(held[:-1]) == history, f"position {p} (slot {slot}) is not ours"
            history.append(held[-1])
        return history

    def prefill_slots(self, ids: Sequence[int], start: int, slots: Any) -> Row:
        return Row(next_token(self._prefill("prefill", ids, start, slots)))

    def prefill_rows(self, ids: Sequence[int], start: int, slots: Any) -> None:
        self._prefill("rows", ids, start, slots)

    def prefill_packed(self, jobs: Sequence[tuple[Sequence[int], int, Any]]) -> Rows:
        """Several prompts' last chunks in one call, recorded as one "packed" call of all their tokens."""
        assert 2 <= len(jobs) <= self.max_packed, f"{len(jobs)} prompts in a packed call"
        assert sum(len(ids) for ids, _, _ in jobs) <= self.packed_tokens
        tokens = [next_token(self._prefill("packed", *job, gate=i == 0)) for i, job in enumerate(jobs)]
        merged = Call("packed", [], [], [])
        for call in self.calls[-len(jobs) :]:
            merged.tokens += call.tokens
            merged.positions += call.positions
            merged.written += call.written
        self.calls[-len(jobs) :] = [merged]
        return Rows(tokens)

    def _prefill(self, kind: str, ids: Sequence[int], start: int, slots: Any, gate: bool = True) -> list[int]:
        if gate:
            self._gate()
        assert len(slots) == start + len(ids) <= self.context_length
        history = self._read(slots, start)
        written = [int(s) for s in slots[start:]]
        self.calls.append(Call(kind, list(ids), list(range(start, start + len(ids))), written))
        if self.fail_prefill(list(ids)):
            raise ZincError("device lost")
        for i, token in enumerate(ids):
            history.append(token)
            self.slab[written[i]] = tuple(history)
        time.sleep(max(0.0, self._device() - time.monotonic()))  # a prompt's call returns once it has run
        return history

    def decode_batch(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[Any]) -> Rows:
        self._gate()
        assert 1 <= len(tokens) <= self.max_batch
        written = [int(s[p]) for s, p in zip(slots, positions, strict=True)]
        assert len(set(written)) == len(written), "two sequences write one slot"
        self.calls.append(Call("decode", list(tokens), list(positions), written))
        histories = []
        for token, pos, own in zip(tokens, positions, slots, strict=True):
            if token == self.fail_on:
                raise ZincError("device lost")
            assert len(own) == pos + 1 and pos < self.context_length
            histories.append([*self._read(own, pos), token])
        for history, slot in zip(histories, written, strict=True):
            self.slab[slot] = tuple(history)
        self.ahead += 1
        self.most_ahead = max(self.most_ahead, self.ahead)
        return Rows([next_token(h) for h in histories], self, self._device())

    def decode_next(self, prev: Rows, positions: Sequence[int], slots: Sequence[Any]) -> Rows:
        """The chained step: `prev`'s rows fed their greedy tokens (recorded as kind "next")."""
        assert len(positions) == len(prev.tokens) == len(slots)
        step = self.decode_batch(prev.tokens, positions, slots)
        self.calls[-1].kind = "next"
        return step

    def rows(self, kind: str) -> list[int]:
        return [len(c.tokens) for c in self.calls if c.kind == kind]
