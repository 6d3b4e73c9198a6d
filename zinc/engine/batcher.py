"""Continuous batching: one loop that steps every running sequence together.

Owns: `Scheduler` — admission (at most `parallel` running sequences and `max_queue` waiting; past
that `QueueFullError` at once), the step loop on its own thread (every device call runs on it), and
each sequence's pages. One iteration runs prefill chunks of the sequences still reading their
prompts, at most `prefill_chunk` tokens in all (`--prefill-chunk`): first, whole and in arrival
order, the prompts that end within it, then the others, fewest tokens left first, with what is left
(a quarter of it, `OLDEST_SHARE`, is kept for the oldest prompt when it cannot end, so a stream of
shorter requests never starves it); then one batched decode of every sequence that is generating. So
a new request never waits for others to finish, a short prompt that comes while a long one is being
prefilled gets its first token after the long one's chunk under way, not after the whole long prompt
(as in vLLM's chunked prefill), running streams never stall for a whole long prompt, and requests
that arrive together start decoding together (one batch from their first token on). A chunk that
does not end its prompt stores its K/V rows only (`prefill_rows`: no output head); the last chunks
of several prompts in one iteration go to the device in one call where the model packs them
(`prefill_packed`); while nothing is decoding, a new prompt waits `batch_wait` for the requests that
come with it (each one restarts the wait, up to `BATCH_WAIT_CAP` times it in all), so that a burst
goes in one such call instead of its first request alone and the rest behind it. Prompts first take
the pages of their longest cached prefix (`PagePool.lookup`); pages grow on demand; when none is
free the least recently used cached page is evicted, then the least recently used session dropped,
then the youngest sequence preempted (its pages freed, it resumes later by prefilling its prompt and
the tokens it generated). The choices of one request (n > 1, one `group`) share their prompt: while one
of them prefills it the others wait, then take its whole pages from the prefix cache and prefill only
the rest (the tokens of its last page), so the prompt is computed once. Per-token choice is the sequence's `TokenPicker`; events go to the
request's `on_event` from the loop thread. While the same batch goes on unchanged (every running
sequence in it, all greedy, each sure to need the next step), its steps are chained: each is fed the
greedy tokens of the one before it on the device, and is enqueued `ENQUEUE_LEAD_S` before that one
is due to end (timed on the batch's recent steps), so the device goes from step to step without
waiting for the host, while a request that comes in before then waits for the running step only; the
host reads back and delivers a step while the next one runs. A row whose sequence ended meanwhile
was run for nothing and is dropped. A waiting request stops the chain (its prompt goes next, behind
the steps already enqueued); any change (a new prompt, an end, a cancel) reads the steps in flight
back first, then plans again. A cancelled sequence stops and frees its pages at the next step
boundary. A model error ends the sequences of that step with an "error" event; the loop keeps
serving. `call` runs another device call on the loop (an embedding): between steps, after those
in flight are read back, ahead of the next iteration's prefills (it stops a chain as a waiting
request does); its future holds the result or the error. `take_scratch` and `release_scratch`
lend pages outside any sequence to such calls (a prompt being scored, zinc.engine.scoring).
Imports: zinc.engine (kv_pages, sequences, generate), zinc.errors, the stdlib.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from zinc.engine.generate import Sampled
from zinc.engine.kv_pages import PagePool, Slots
from zinc.engine.sequences import (
    BatchStep,
    FinishEvent,
    FinishKind,
    SchedulerStats,
    SequenceRequest,
    StepModel,
    TokenEvent,
)
from zinc.errors import ContextLengthExceededError, EngineClosedError, QueueFullError, ZincError

T = TypeVar("T")
# Decode steps on the device at once while a batch goes on unchanged: the next is enqueued before
# the one running ends, so the device never waits for the host between steps...
CHAIN_DEPTH = 2
# ... but only this long before that one is due to end (about what enqueueing a step takes on a
# busy host): a request that comes in earlier waits for the running step only, not for one more.
ENQUEUE_LEAD_S = 0.003
STEP_TIMES = 8  # a step's expected time is the shortest of the batch's last few (a late read is longer)
# While nothing is decoding, a prompt waits this long after the newest request for others to come
# with it. Streams sent at once reach the scheduler 0.3-1.5 ms apart on a busy 2-core host (each is
# parsed and tokenized on the event loop): without the wait the first went alone (a 12-token
# prompt, 11 ms) and the rest in a second call. A lone request pays the wait once, on its first token.
BATCH_WAIT_S = 0.001
BATCH_WAIT_CAP = 8  # the whole wait is at most this many times `batch_wait` (requests keep coming)
# While shorter prompts go first, the oldest prompt still gets at least this fraction of each
# iteration's prefill budget (`prefill_chunk`): a stream of short requests never starves a long one.
OLDEST_SHARE = 4
log = logging.getLogger("zinc.engine")


@dataclass
class _Sequence:
    req: SequenceRequest
    pending: list[int]  # tokens to run next: the prompt (or its rest), then the last sampled token
    fed: list[int] = field(default_factory=list)  # tokens whose K/V rows are in the cache
    pages: list[int] = field(default_factory=list)
    generated: int = 0
    cached: int = 0
    admitted: bool = False
    arrival: int = 0  # submission order: the youngest (largest) is preempted first
    cancelled: bool = False
    finished: bool = False
    table: tuple[list[int], Slots] | None = None  # the slots of `pages` as last computed

    def slots(self, pool: PagePool, n: int) -> Slots:
        """The slots of positions 0..n-1, recomputed only when the page table changed (a decode
        step would otherwise rebuild every position's slot for every row)."""
        if self.table is None or self.table[0] != self.pages:
            self.table = (list(self.pages), pool.slots(self.pages, len(self.pages) * pool.page_size))
        return self.table[1][:n]

    @property
    def decoding(self) -> bool:
        return self.generated > 0 and len(self.pending) == 1


class SequenceHandle:
    def __init__(self, scheduler: Scheduler, seq: _Sequence) -> None:
        self._scheduler, self._seq = scheduler, seq

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens taken from the prefix cache (known once the request is admitted)."""
        return self._seq.cached

    def cancel(self) -> None:
        """Stop the sequence; its pages are freed at the next step boundary."""
        self._seq.cancelled = True
        self._scheduler.wake()


class Scheduler:
    def __init__(
        self,
        model: StepModel,
        *,
        page_size: int = 16,
        parallel: int = 8,
        max_queue: int = 16,
        prefill_chunk: int = 128,
        batch_wait: float = BATCH_WAIT_S,
    ) -> None:
        self.model = model
        self.batch_wait = batch_wait
        self.parallel = max(1, parallel)
        self.max_queue = max_queue
        self.prefill_chunk = max(1, prefill_chunk)  # prompt tokens per iteration, all prompts together
        self.pool = PagePool(model.kv_slots // page_size, page_size)
        if (self.pool.num_pages - 1) * page_size < model.context_length:
            raise ValueError("the KV slab must hold at least one whole context")
        self._cond = threading.Condition()
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._closed = False
        self._arrivals = 0
        self._submitted = 0.0  # when the newest request came (time.monotonic)
        self._gathering: float | None = None  # when the current wait for a burst's requests began
        self._inflight: deque[_Inflight] = deque()  # decode steps enqueued, not yet read back
        self._started = 0.0  # when the oldest step on the device started there (time.monotonic)
        self._step_times: deque[float] = deque(maxlen=STEP_TIMES)  # the last steps' device times
        self._timed: list[_Sequence] = []  # the batch they were timed on
        self._calls: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()  # `call`s to run
        self._thread = threading.Thread(target=self._loop, name="zinc-scheduler", daemon=True)

    # --- the caller's side (any thread) --------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        else:  # never started (or already gone): nobody else will answer the waiting requests
            with self._cond:
                for seq in [*self._running, *self._waiting]:
                    self._finish(seq, "abort")
                self._waiting.clear()
                self._abort_calls()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def submit(self, req: SequenceRequest) -> SequenceHandle:
        n = len(req.prompt_ids)
        if n == 0 or n >= self.model.context_length:
            raise ContextLengthExceededError(n, self.model.context_length)
        seq = _Sequence(req, list(req.prompt_ids))
        with self._cond:
            self._arrivals += 1
            seq.arrival = self._arrivals
            if self._closed:
                raise EngineClosedError("the engine is shutting down; retry later")
            if len(self._running) + len(self._waiting) >= self.parallel + self.max_queue:
                raise QueueFullError(
                    f"the server is busy: {len(self._running)} requests running and {len(self._waiting)} waiting; retry later"
                )
            self._waiting.append(seq)
            self._submitted = time.monotonic()
            self._cond.notify_all()
        return SequenceHandle(self, seq)

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `fn` (a device call) on the loop's thread between steps; past `max_queue` calls
        waiting, `QueueFullError` at once."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise EngineClosedError("the engine is shutting down; retry later")
            if len(self._calls) >= self.max_queue:
                raise QueueFullError(f"the server is busy: {len(self._calls)} calls waiting; retry later")
            self._calls.append((fn, future))
            self._cond.notify_all()
        return future

    def take_scratch(self, positions: int) -> tuple[list[int], Slots]:
        """Pages for `positions` positions outside any sequence (a prompt being scored,
        zinc.engine.scoring) and their slots; `ContextLengthExceededError` past the context,
        `QueueFullError` when none are free even after dropping sessions' pages."""
        if positions >= self.model.context_length:
            raise ContextLengthExceededError(positions, self.model.context_length)
        with self._cond:
            pages = self._scratch_pages(positions)
        return pages, self.pool.slots(pages, positions)

    def release_scratch(self, pages: list[int]) -> None:
        """Give `take_scratch`'s pages back once the calls queued before now have run (they
        may still write them): a call of its own, queued past `max_queue`."""

        def release() -> None:
            with self._cond:
                self.pool.release(pages)

        with self._cond:
            if not self._closed:
                self._calls.append((release, concurrent.futures.Future()))
                self._cond.notify_all()

    def _scratch_pages(self, positions: int) -> list[int]:
        """Pages for `positions` positions (dropping sessions' pages if need be; the lock is held)."""
        pages: list[int] = []
        while len(pages) * self.pool.page_size < positions:
            page = self.pool.allocate()
            if page is None and self.pool.drop_oldest_session():
                continue
            if page is None:
                self.pool.release(pages)
                raise QueueFullError("the KV cache has no room to score this prompt now; retry later")
            pages.append(page)
        return pages

    def release_session(self, session_id: str) -> bool:
        with self._cond:
            return self.pool.unpin(session_id)

    def stats(self) -> SchedulerStats:
        with self._cond:
            return SchedulerStats(len(self._running), len(self._waiting), self.pool.stats())

    # --- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._waiting or self._running or self._inflight or self._calls):
                    self._cond.wait()
                if self._closed:
                    break
                try:
                    self._reap()
                    self._admit()
                except Exception as exc:  # never leave requests hanging on a bookkeeping fault
                    log.error("scheduler fault; ending every request", exc_info=exc)
                    for seq in [*self._running, *self._waiting]:
                        self._finish(seq, "error", ZincError(f"scheduler fault: {exc}"))
                    self._running.clear()
                    self._waiting.clear()
                    continue
                prefills, decode = self._plan()
                if prefills and not decode and not self._inflight and (gather := self._gather()) > 0:
                    self._cond.wait(gather)  # a new request wakes it, and restarts the wait
                    continue
                self._gathering = None  # the wait is over (or was cut short by a cancel)
                chain = not prefills and self._chains(decode, len(self._inflight))
                held = chain and len(self._inflight) == CHAIN_DEPTH - 1 and (hold := self._hold()) > 0
                if held and self._cond.wait(hold):  # a new request (or a cancel) wakes it at once:
                    continue  # plan again; when the wait runs out instead, the plan stands
            if self._inflight:  # steps are on the device: enqueue one more behind them, or read one back
                if chain and len(self._inflight) < CHAIN_DEPTH:
                    self._guard(decode, self._next, self._inflight[-1])
                else:
                    self._guard(self._inflight[0].group, self._complete, self._inflight[0])
                continue  # plan again: that step's tokens changed what runs next
            self._run_calls()
            self._prefills(prefills)
            for at in range(0, len(decode), self.model.max_batch):
                group = decode[at : at + self.model.max_batch]
                self._guard(group, self._decode, group)
        with self._cond:
            for seq in [*self._running, *self._waiting]:
                self._finish(seq, "abort")
            self._abort_calls()

    def _abort_calls(self) -> None:
        """Fail the `call`s still waiting: the engine closed (the lock is held)."""
        for _, future in self._calls:
            future.set_exception(EngineClosedError("the engine shut down before this request finished; retry it"))
        self._calls.clear()

    def _run_calls(self) -> None:
        """The `call`s waiting now, in order (new ones wait for the next iteration)."""
        with self._cond:
            calls = list(self._calls)
            self._calls.clear()
        for fn, future in calls:
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except Exception as exc:  # the caller's: a device failure fails this call only
                future.set_exception(exc)

    def _guard(self, seqs: list[_Sequence], run: Callable[[T], None], arg: T) -> None:
        try:
            run(arg)
        except Exception as exc:  # a device or sampling failure ends this step's sequences only
            self._inflight.clear()  # drop the chained steps: their sequences, if any go on, run them again
            error = exc if isinstance(exc, ZincError) else ZincError(f"generation failed: {exc}")
            with self._cond:
                for seq in seqs:
                    if not seq.finished:
                        self._finish(seq, "error", error)

    def _reap(self) -> None:
        for seq in [s for s in self._running if s.cancelled]:
            self._finish(seq, "abort")
        for seq in [s for s in self._waiting if s.cancelled]:
            self._waiting.remove(seq)
            self._finish(seq, "abort")

    def _admit(self) -> None:
        held: list[_Sequence] = []  # choices waiting for a sibling to prefill their shared prompt
        try:
            self._admit_in_order(held)
        finally:
            self._waiting.extendleft(reversed(held))

    def _admit_in_order(self, held: list[_Sequence]) -> None:
        while self._waiting and len(self._running) < self.parallel:
            seq = self._waiting[0]
            if seq.req.group is not None and not seq.fed and self._share(seq):
                held.append(self._waiting.popleft())
                continue
            if not seq.fed:  # a new sequence (or a preempted one) reuses its longest cached prefix
                tokens = seq.pending
                seq.pages = self.pool.lookup(tokens)
                n = len(seq.pages) * self.pool.page_size
                seq.fed, seq.pending = tokens[:n], tokens[n:]
                if seq.req.session_id is not None:
                    self.pool.touch(seq.req.session_id)
            if not self._grow(seq, len(seq.fed) + len(seq.pending), preempt=False):
                self.pool.release(seq.pages)  # a waiting sequence holds no pages
                seq.pages, seq.pending, seq.fed = [], seq.fed + seq.pending, []
                if self._running:
                    return  # wait for pages to free up
                self._waiting.popleft()
                self._finish(seq, "error", ZincError("the KV cache is too small for this prompt"))
                continue
            if not seq.admitted:  # a preempted sequence keeps the figure of its first admission
                seq.cached = min(len(seq.fed), len(seq.req.prompt_ids))
                seq.admitted = True
            self._waiting.popleft()
            self._running.append(seq)

    def _share(self, seq: _Sequence) -> bool:
        """Whether `seq` must wait for a running sibling (the lock is held): the choices of one
        request (`group`) share their prompt, so while one of them is still prefilling it the
        others wait; once it is done its whole pages go into the prefix cache, and each of the
        others takes them (`lookup`) and prefills only the rest, the last page's tokens."""
        prompt = seq.req.prompt_ids
        for other in self._running:
            if other.req.group != seq.req.group or other.finished or other.req.prompt_ids != prompt:
                continue
            if len(other.fed) < len(prompt):
                return True  # still reading the prompt
            self.pool.register(other.pages, other.fed[: len(prompt)])
        return False

    def _grow(self, seq: _Sequence, positions: int, preempt: bool) -> bool:
        """Give `seq` pages for `positions` positions; evict, drop sessions, then (if `preempt`)
        preempt younger sequences to find them."""
        need = -(-positions // self.pool.page_size) - len(seq.pages)
        while need > 0:
            page = self.pool.allocate()
            if page is None and self.pool.drop_oldest_session():
                continue
            if page is None and preempt:
                victim = max(self._running, key=lambda s: s.arrival)
                if victim is not seq:
                    self._preempt(victim)
                    continue
            if page is None:
                return False
            seq.pages.append(page)
            need -= 1
        return True

    def _preempt(self, seq: _Sequence) -> None:
        self._running.remove(seq)
        self.pool.release(seq.pages)
        seq.pages, seq.pending, seq.fed = [], seq.fed + seq.pending, []
        self._waiting.appendleft(seq)

    def _plan(self) -> tuple[list[tuple[_Sequence, int]], list[_Sequence]]:
        """This iteration's prefill chunks and decode rows (the lock is held): `prefill_chunk`
        tokens in all for the sequences still reading their prompts, and the sequences generating.

        The prompts that can end in this iteration go first, whole, in arrival order (their last
        chunks run first, and pack together); then the others, fewest tokens left first, take what
        is left. So a short prompt that comes while a long one is being prefilled gets its first
        token after the long one's chunk under way, not after the whole long prompt; and the
        oldest prompt is never starved by a stream of shorter ones: when it cannot end in this
        iteration, `prefill_chunk // OLDEST_SHARE` tokens are kept for it."""
        decode: list[_Sequence] = []
        prompts: list[_Sequence] = []
        for seq in self._running:
            if seq.generated and len(seq.pending) == 1:  # `decoding`, inlined: this runs every step
                decode.append(seq)
            else:
                prompts.append(seq)
        budget = self.prefill_chunk
        if len(prompts) <= 1:
            return [(seq, min(len(seq.pending), budget)) for seq in prompts], decode
        prompts.sort(key=_by_arrival)  # a preempted sequence is back in `_running` behind younger ones
        oldest = prompts[0]
        kept = 0 if len(oldest.pending) <= budget else max(1, budget // OLDEST_SHARE)  # the oldest's share
        plan: list[tuple[_Sequence, int]] = []
        rest: list[_Sequence] = []  # the prompts that cannot end in this iteration
        for seq in prompts:
            n = len(seq.pending)
            if n <= budget - (0 if seq is oldest else kept):
                plan.append((seq, n))
                budget -= n
            else:
                rest.append(seq)
        rest.sort(key=_by_remaining)
        for seq in rest:
            n = min(len(seq.pending), budget - (0 if seq is oldest else kept))
            if n > 0:
                plan.append((seq, n))
                budget -= n
            kept = 0 if seq is oldest else kept
        return plan, decode

    def _prefills(self, plan: list[tuple[_Sequence, int]]) -> None:
        """Run this iteration's prefill chunks: the prompts' last chunks packed into calls of up to
        `max_packed` prompts and `packed_tokens` tokens where the model packs them (one call
        instead of one per prompt, the same rows and tokens), the others one by one."""
        size, tokens = self.model.max_packed, self.model.packed_tokens
        groups: list[list[tuple[_Sequence, int]]] = []  # in the plan's order, oldest first
        for seq, n in plan:
            group = groups[-1] if groups else []
            last = n == len(seq.pending)  # an earlier chunk of a prompt (its rows only) stands alone
            if last and 0 < len(group) < size and group[-1][1] == len(group[-1][0].pending) and (
                sum(m for _, m in group) + n <= tokens
            ):
                group.append((seq, n))
            else:
                groups.append([(seq, n)])
        for group in groups:
            if len(group) == 1:
                self._guard([group[0][0]], self._prefill, group[0])
            else:
                self._guard([seq for seq, _ in group], self._prefill_packed, group)

    def _prefill_packed(self, group: list[tuple[_Sequence, int]]) -> None:
        """The last chunks of several prompts in one call, then each one's first token."""
        group = [(seq, n) for seq, n in group if not seq.finished]
        if len(group) < 2:
            for job in group:
                self._prefill(job)
            return
        jobs = [(seq.pending[:n], len(seq.fed), seq.slots(self.pool, len(seq.fed) + n)) for seq, n in group]
        step = self.model.prefill_packed(jobs)
        for i, (seq, n) in enumerate(group):
            self._fed(seq, n)
            self._guard([seq], self._pick, (seq, step, i))

    def _prefill(self, job: tuple[_Sequence, int]) -> None:
        seq, n = job
        if seq.finished:  # an earlier chunk of this iteration failed it
            return
        chunk, start = seq.pending[:n], len(seq.fed)
        slots = seq.slots(self.pool, start + n)
        if n < len(seq.pending):  # the prompt goes on: its K/V rows only
            self.model.prefill_rows(chunk, start, slots)
            self._fed(seq, n)
            return
        step = self.model.prefill_slots(chunk, start, slots)
        self._fed(seq, n)
        self._after(seq, seq.req.picker.pick(step.token, step.logits))  # the prompt's next token

    def _fed(self, seq: _Sequence, n: int) -> None:
        with self._cond:
            seq.fed += seq.pending[:n]
            seq.pending = seq.pending[n:]

    def _decode(self, group: list[_Sequence]) -> None:
        with self._cond:
            group = [s for s in group if not s.finished and s.decoding]
            for seq in group:
                if seq in self._running and not self._grow(seq, len(seq.fed) + 1, preempt=True):
                    if len(self._running) > 1:
                        self._preempt(seq)  # it is the youngest: it waits for the others
                    else:
                        self._finish(seq, "length")  # alone and still no page: the slab is full
            group = [s for s in group if s in self._running]
            positions = [len(s.fed) for s in group]
            slots = [s.slots(self.pool, p + 1) for s, p in zip(group, positions, strict=True)]
            chain = len(group) == len(self._running) and self._chains(group, 1)
        if not group:
            return
        self._started = time.monotonic()  # the device is idle: the step runs from now
        step = _Inflight(group, self.model.decode_batch([s.pending[0] for s in group], positions, slots))
        self._inflight.append(step)
        if not chain:  # else the next iteration enqueues the step after it before reading it back
            self._complete(step)

    def _chains(self, group: list[_Sequence], ahead: int) -> bool:
        """Whether one more step can be enqueued behind the `ahead` steps of `group` on the device
        (the lock is held), before they are read back: the same sequences (all that run, in one
        batch), each taking the device's greedy token and sure to need that step (its token within
        max_tokens, its position within the context)."""
        if not group or len(group) > self.model.max_batch or self._calls:
            return False
        if self._inflight and not _same(group, self._inflight[-1].group):
            return False
        context = self.model.context_length - ahead - 1
        for s in group:
            req = s.req
            if s.cancelled or req.picker.read_logits or s.generated + ahead >= req.max_tokens or len(s.fed) > context:
                return False
        return True

    def _next(self, last: _Inflight) -> None:
        """Enqueue the step after `last` (the newest on the device), fed its greedy tokens on the
        device, without waiting for it: the device goes from one step to the next while the host
        reads back and delivers the one before. Not when a waiting request could be admitted (its
        prompt goes next, behind as few steps as possible) or a page cannot be had."""
        ahead = len(self._inflight)
        with self._cond:
            admits = bool(self._waiting) and len(self._running) < self.parallel  # a prompt could go in now
            grown = not admits and all(self._grow(s, len(s.fed) + ahead + 1, preempt=False) for s in last.group)
            positions = [len(s.fed) + ahead for s in last.group]  # the steps ahead feed the tokens before
            slots = [s.slots(self.pool, p + 1) for s, p in zip(last.group, positions, strict=True) if grown]
        if not grown:
            self._complete(self._inflight[0])
            return
        self._inflight.append(_Inflight(last.group, self.model.decode_next(last.step, positions, slots)))

    def _gather(self) -> float:
        """Seconds to wait before prefilling while nothing is decoding (the lock is held): until
        `batch_wait` after the newest request, and no later than `BATCH_WAIT_CAP` times that after
        the wait began."""
        now = time.monotonic()
        if self._gathering is None:
            self._gathering = now
        return min(self._submitted + self.batch_wait, self._gathering + BATCH_WAIT_CAP * self.batch_wait) - now

    def _hold(self) -> float:
        """Seconds to wait before enqueueing the step after the one running (the lock is held):
        until `ENQUEUE_LEAD_S` before it is due to end, as long after its start as the batch's
        recent steps took."""
        if not self._step_times or not _same(self._timed, self._inflight[0].group):
            return 0.0
        return self._started + min(self._step_times) - ENQUEUE_LEAD_S - time.monotonic()

    def _complete(self, step: _Inflight) -> None:
        """Read back `step` (the oldest on the device) and deliver each row's token (rows of
        sequences that ended meanwhile are dropped: a chained step ran them for nothing)."""
        self._inflight.popleft()
        step.step.wait()
        now = time.monotonic()
        if not _same(self._timed, step.group):
            self._timed = step.group
            self._step_times.clear()
        self._step_times.append(now - self._started)  # longer if read late: the shortest counts
        self._started = now  # the step queued behind it, if any, runs from now
        with self._cond:
            rows = [(i, seq) for i, seq in enumerate(step.group) if not seq.finished]
            for _, seq in rows:
                seq.fed.append(seq.pending.pop())
        for i, seq in rows:  # only this thread finishes a sequence: none of these ended meanwhile
            self._guard([seq], self._pick, (seq, step.step, i))

    def _pick(self, row: tuple[_Sequence, BatchStep, int]) -> None:
        seq, step, i = row
        self._after(seq, seq.req.picker.pick(step.token(i), _row(step, i)))

    def _after(self, seq: _Sequence, sampled: Sampled) -> None:
        """Deliver a sampled token and decide whether the sequence goes on."""
        seq.generated += 1
        seq.req.on_event(TokenEvent(sampled))
        token, req = sampled.token, seq.req
        with self._cond:
            if token in req.stop_ids or req.picker.done:
                self._finish(seq, "stop")
            elif seq.generated >= req.max_tokens or len(seq.fed) >= self.model.context_length:
                self._finish(seq, "length")
            else:
                seq.pending = [token]

    def _finish(self, seq: _Sequence, reason: FinishKind, error: ZincError | None = None) -> None:
        """End `seq` (the lock is held): cache its whole pages, pin them for its session, free them."""
        if seq.finished:
            return
        seq.finished = True
        if seq in self._running:
            self._running.remove(seq)
        if seq.pages:
            cached = self.pool.register(seq.pages, seq.fed)  # the pages a later lookup finds
            if seq.req.session_id is not None and reason in ("stop", "length"):
                self.pool.pin(seq.req.session_id, cached)
            self.pool.release(seq.pages)
            seq.pages = []
        event = FinishEvent(reason, len(seq.req.prompt_ids), seq.generated, seq.cached, error)
        with contextlib.suppress(Exception):  # a consumer that is gone must not stop the loop
            seq.req.on_event(event)


@dataclass
class _Inflight:
    group: list[_Sequence]
    step: BatchStep


def _by_arrival(seq: _Sequence) -> int:
    return seq.arrival


def _by_remaining(seq: _Sequence) -> tuple[int, int]:
    """Fewest prompt tokens left first; the oldest first among equals."""
    return len(seq.pending), seq.arrival


def _same(a: list[_Sequence], b: list[_Sequence]) -> bool:
    """The same sequences in the same order (identity: a sequence's fields change as it runs)."""
    return a is b or (len(a) == len(b) and all(map(operator.is_, a, b)))


def _row(step: BatchStep, i: int) -> Callable[[], Any]:
    return lambda: step.logits(i)
