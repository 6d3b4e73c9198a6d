"""EventRelay (zinc.engine.relay): events posted from another thread reach the loop in order, a
batch of them with one wake-up, and a closed loop is an error, not a lost relay. EventChannel: a
request's events reach its reader in order, a reader waits for the next one, and a cancelled
wait loses none."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from zinc.engine.relay import EventChannel, EventRelay


class CountingLoop:
    """Stands in for a loop: counts wake-ups and runs them when told to."""

    def __init__(self) -> None:
        self.wakeups: list[Any] = []
        self.closed = False

    def call_soon_threadsafe(self, callback: Any) -> None:
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.wakeups.append(callback)

    def run(self) -> None:
        ready, self.wakeups = self.wakeups, []
        for callback in ready:
            callback()


def test_events_posted_before_the_loop_runs_wake_it_once_in_order() -> None:
    loop = CountingLoop()
    relay = EventRelay(loop)  # type: ignore[arg-type]
    seen: list[tuple[str, int]] = []
    for i in range(5):
        relay.post(lambda e: seen.append(("a", e)), i)
        relay.post(lambda e: seen.append(("b", e)), 10 + i)
    assert len(loop.wakeups) == 1
    loop.run()
    assert seen == [p for i in range(5) for p in (("a", i), ("b", 10 + i))]
    relay.post(lambda e: seen.append(("a", e)), 99)  # a new batch wakes the loop again
    assert len(loop.wakeups) == 1
    loop.run()
    assert seen[-1] == ("a", 99)


def test_a_closed_loop_raises_and_a_later_batch_wakes_the_loop_again() -> None:
    loop = CountingLoop()
    relay = EventRelay(loop)  # type: ignore[arg-type]
    loop.closed = True
    with pytest.raises(RuntimeError):
        relay.post(print, "lost")
    loop.closed = False
    seen: list[str] = []
    relay.post(seen.append, "kept")
    assert len(loop.wakeups) == 1  # not left waiting behind the dropped batch
    loop.run()
    assert seen == ["kept"]


def test_a_hand_over_that_raises_does_not_lose_the_rest_of_its_batch() -> None:
    loop = CountingLoop()
    relay = EventRelay(loop)  # type: ignore[arg-type]
    seen: list[int] = []

    def fails(event: int) -> None:
        raise RuntimeError("gone")

    relay.post(seen.append, 1)
    relay.post(fails, 2)
    relay.post(seen.append, 3)
    loop.run()
    assert seen == [1, 3]


def test_events_from_another_thread_arrive_on_the_loop_in_order() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        relay = EventRelay(loop)
        queue: asyncio.Queue[int] = asyncio.Queue()
        threads: list[int] = []

        def put(item: int) -> None:
            threads.append(threading.get_ident())
            queue.put_nowait(item)

        worker = threading.Thread(target=lambda: [relay.post(put, i) for i in range(2000)])
        worker.start()
        got = [await asyncio.wait_for(queue.get(), 10) for _ in range(2000)]
        worker.join()
        assert set(threads) == {threading.get_ident()}  # delivered on the loop's thread
        return got

    assert asyncio.run(main()) == list(range(2000))


def test_a_channel_hands_its_events_over_in_order_and_waits_for_the_next() -> None:
    async def main() -> list[int]:
        channel: EventChannel[int] = EventChannel()
        channel.put(1)
        channel.put(2)
        got = [await channel.get(), await channel.get()]
        reader = asyncio.ensure_future(channel.get())
        await asyncio.sleep(0.01)
        assert not reader.done()  # nothing to read: it waits
        channel.put(3)
        channel.put(4)
        got += [await asyncio.wait_for(reader, 5), await channel.get()]
        return got

    assert asyncio.run(main()) == [1, 2, 3, 4]


def test_a_cancelled_wait_on_a_channel_loses_no_event() -> None:
    async def main() -> list[int]:
        channel: EventChannel[int] = EventChannel()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(channel.get(), 0.01)
        channel.put(7)  # comes after the cancelled wait: the next reader gets it
        channel.put(8)
        return [await asyncio.wait_for(channel.get(), 5), await channel.get()]

    assert asyncio.run(main()) == [7, 8]
