"""The KV page pool (zinc.engine.kv_pages.PagePool) on its own: allocation and reference counts,
the prefix cache's chain keys, LRU eviction of cached pages, session pins and their LRU drop, the
stats, and the slot of every position. No scheduler and no model: each test drives the pool the
way the scheduler does (lookup, allocate, register, pin, release) and checks what it hands out.
"""

from __future__ import annotations

import pytest

from zinc.engine.kv_pages import PagePool

PAGE = 4


def take(pool: PagePool, n: int) -> list[int]:
    pages = [pool.allocate() for _ in range(n)]
    assert None not in pages, "the pool ran out"
    return [p for p in pages if p is not None]


def cache(pool: PagePool, tokens: list[int]) -> list[int]:
    """A finished sequence that held `tokens`: its whole pages stay cached, unreferenced."""
    pages = take(pool, -(-len(tokens) // PAGE))
    pool.register(pages, tokens)
    pool.release(pages)
    return pages


def test_pages_are_distinct_never_scratch_and_run_out() -> None:
    pool = PagePool(6, PAGE)
    pages = take(pool, 5)
    assert sorted(pages) == [1, 2, 3, 4, 5]  # page 0 is scratch
    assert pool.allocate() is None
    stats = pool.stats()
    assert (stats.total, stats.in_use, stats.free, stats.cached) == (5, 5, 0, 0)
    pool.release(pages[:2])
    assert pool.stats().free == 2 and pool.available() == 2
    assert sorted(take(pool, 2)) == sorted(pages[:2])


def test_a_page_is_freed_only_when_its_last_reference_goes() -> None:
    pool = PagePool(4, PAGE)
    tokens = list(range(10, 19))  # two whole pages and one token
    pages = cache(pool, tokens)
    first, second = pool.lookup(tokens), pool.lookup(tokens)
    assert first == second == pages[:2]
    pool.release(first)
    assert pool.stats().in_use == 2  # the second holder still reads them
    pool.release(second)
    assert pool.stats().in_use == 0 and pool.stats().cached == 2
    with pytest.raises(AssertionError, match="released twice"):
        pool.release(second[:1])


@pytest.mark.parametrize(("length", "covered"), [(3, 0), (4, 0), (5, 1), (8, 1), (9, 2), (12, 2), (13, 3)])
def test_lookup_takes_whole_pages_and_leaves_a_token_to_compute(length: int, covered: int) -> None:
    pool = PagePool(8, PAGE)
    tokens = list(range(100, 116))
    pages = cache(pool, tokens)
    assert pool.lookup(tokens[:length]) == pages[:covered]


def test_the_chain_key_depends_on_every_earlier_page() -> None:
    pool = PagePool(8, PAGE)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    pages = cache(pool, a)
    assert pool.lookup([1, 2, 3, 4, 5, 6, 7, 99, 9]) == pages[:1]  # second page differs
    assert pool.lookup([0, 2, 3, 4, 5, 6, 7, 8, 9]) == []  # same second page after another first
    assert pool.lookup([5, 6, 7, 8, 1, 2, 3, 4, 9]) == []  # the same pages in another order


def test_registering_a_prefix_cached_elsewhere_keeps_the_first_copy() -> None:
    pool = PagePool(8, PAGE)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    first = cache(pool, tokens)
    again = cache(pool, tokens)  # computed twice (e.g. two requests at once): one copy is kept
    assert pool.lookup(tokens) == first[:2]
    stats = pool.stats()
    assert stats.cached == 0 and stats.in_use == 2  # the copy's pages went back to the free list
    assert not set(again[:2]) & set(pool.lookup(tokens))


def test_only_whole_known_pages_are_registered() -> None:
    pool = PagePool(8, PAGE)
    pages = take(pool, 3)
    pool.register(pages, list(range(10)))  # the third page has two of its four positions
    pool.release(pages)
    assert pool.stats().cached == 2 and pool.stats().free == 5


def test_least_recently_used_cached_pages_are_evicted_first() -> None:
    pool = PagePool(7, PAGE)  # six usable pages
    old, new = [10, 11, 12, 13, 14], [20, 21, 22, 23, 24]
    cache(pool, old)  # one whole page cached
    cache(pool, new)
    pool.release(pool.lookup(old))  # `old` was used again: now `new` is the least recent
    assert pool.stats().cached == 2
    take(pool, pool.stats().free)  # every never-used page
    take(pool, 1)  # evicts one cached page
    assert pool.lookup(new) == [] and len(pool.lookup(old)) == 1
    assert pool.allocate() is None  # the page `old` is referenced: it cannot be evicted


def test_referenced_cached_pages_are_not_evicted() -> None:
    pool = PagePool(3, PAGE)
    tokens = list(range(9))
    cache(pool, tokens[:8])
    held = pool.lookup(tokens)
    assert len(held) == 2
    assert pool.allocate() is None
    pool.release(held)
    assert pool.allocate() in held  # evicted now, and gone from the cache
    assert pool.lookup(tokens) == []


def test_a_session_pins_its_pages_until_released() -> None:
    pool = PagePool(8, PAGE)
    tokens = list(range(9))
    pages = take(pool, 3)
    pool.register(pages, tokens)
    pool.pin("chat", pages[:2])
    pool.release(pages)
    stats = pool.stats()
    assert (stats.in_use, stats.cached, stats.sessions) == (2, 0, 1)
    take(pool, pool.available())  # pinned pages survive a pool that runs dry
    assert pool.lookup(tokens) == pages[:2]
    assert pool.unpin("chat") and not pool.unpin("chat") and not pool.unpin("other")
    assert pool.stats().sessions == 0


def test_pinning_again_replaces_the_sessions_pages() -> None:
    pool = PagePool(8, PAGE)
    history = list(range(13))
    turn1 = take(pool, 2)
    pool.register(turn1, history[:8])
    pool.pin("chat", turn1)
    pool.release(turn1)
    turn2 = [*pool.lookup(history), *take(pool, 1)]  # the next turn starts from turn1's pages
    assert turn2[:2] == turn1
    pool.register(turn2, history[:12])
    pool.pin("chat", turn2)
    pool.release(turn2)
    stats = pool.stats()
    assert (stats.in_use, stats.cached, stats.sessions) == (3, 0, 1)
    pool.unpin("chat")
    stats = pool.stats()
    assert (stats.in_use, stats.cached, stats.free) == (0, 3, 4)


def test_the_least_recently_used_session_is_dropped_first() -> None:
    pool = PagePool(8, PAGE)
    for name in ("a", "b", "c"):
        pages = take(pool, 1)
        pool.pin(name, pages)
        pool.release(pages)
    pool.touch("a")  # a's conversation went on: b is now the oldest
    assert pool.drop_oldest_session() and pool.stats().sessions == 2
    assert not pool.unpin("b") and pool.unpin("a") and pool.unpin("c")
    assert not pool.drop_oldest_session()


def test_slots_follow_the_page_table() -> None:
    pool = PagePool(8, PAGE)
    table = [5, 2, 7]
    slots = pool.slots(table, 10)
    assert slots.dtype.name == "int32"
    assert slots.tolist() == [20, 21, 22, 23, 8, 9, 10, 11, 28, 29]
    assert pool.slots(table, 0).tolist() == []


def test_a_pool_needs_a_page_beside_the_scratch_page() -> None:
    with pytest.raises(ValueError):
        PagePool(1, PAGE)
    with pytest.raises(ValueError):
        PagePool(4, 0)
