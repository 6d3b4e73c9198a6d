"""KV-cache pages: the allocator, the prefix cache and session pins over the device slab.

Owns: `PagePool` — the slab's slots grouped into pages of `page_size` positions (page p holds
slots [p * page_size, (p + 1) * page_size); page 0 is scratch and never handed out). Pages are
reference counted. A full page whose tokens are known is registered in the prefix cache under a
chain key (the previous page's key and its own token ids), so a later prompt with the same prefix
takes the same pages instead of computing them. A page nobody references stays cached and is
evicted least recently used first when a page is needed. A session (`session_id`) keeps
references to its conversation's pages between requests until it is released or, when pages run
out, dropped least recently used first.
Imports: numpy and the stdlib only.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Slots = np.ndarray[Any, np.dtype[np.int32]]


@dataclass(frozen=True)
class PageStats:
    page_size: int
    total: int  # pages that sequences can use (scratch excluded)
    in_use: int  # referenced by a running sequence or a session
    cached: int  # unreferenced but holding a cached prefix (evictable)
    free: int  # never used or evicted
    sessions: int


class PagePool:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 2 or page_size < 1:
            raise ValueError("a page pool needs at least 2 pages of at least 1 slot")
        self.page_size = page_size
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, 0, -1))  # pop() hands out low pages first
        self._refs = [0] * num_pages
        self._key_of: dict[int, bytes] = {}  # cached page -> its chain key
        self._page_of: dict[bytes, int] = {}  # chain key -> page
        self._idle: OrderedDict[int, None] = OrderedDict()  # cached pages nobody references, LRU first
        self._sessions: OrderedDict[str, list[int]] = OrderedDict()  # session -> pinned pages, LRU first

    # --- allocation --------------------------------------------------------------------------

    def available(self) -> int:
        """Pages that can be handed out now without dropping a session."""
        return len(self._free) + len(self._idle)

    def allocate(self) -> int | None:
        """A page with refcount 1, evicting the least recently used cached page if needed;
        None when every page is referenced (the caller may drop a session or preempt)."""
        if self._free:
            page = self._free.pop()
        elif self._idle:
            page, _ = self._idle.popitem(last=False)
            key = self._key_of.pop(page)
            del self._page_of[key]
        else:
            return None
        self._refs[page] = 1
        return page

    def release(self, pages: Sequence[int]) -> None:
        """Drop one reference to each page; an unreferenced page stays cached if it has a key."""
        for page in pages:
            self._refs[page] -= 1
            assert self._refs[page] >= 0, f"page {page} released twice"
            if self._refs[page] == 0:
                if page in self._key_of:
                    self._idle[page] = None
                else:
                    self._free.append(page)

    # --- prefix cache --------------------------------------------------------------------------

    @staticmethod
    def chain_key(parent: bytes, tokens: Sequence[int]) -> bytes:
        """A 128-bit digest of a page's tokens and everything before them: equal keys mean equal
        prefixes (a collision is as likely as one of BLAKE2b's), unlike Python's 64-bit hash."""
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(np.asarray(tokens, dtype=np.int64).tobytes())
        return digest.digest()

    def lookup(self, tokens: Sequence[int]) -> list[int]:
        """The cached pages holding the longest whole-page prefix of `tokens`, each now referenced
        once more. At least one token is always left uncovered (its logits are needed)."""
        pages: list[int] = []
        key = b""
        n = self.page_size
        for start in range(0, len(tokens) - n, n):  # whole pages, never the last token
            key = self.chain_key(key, tokens[start : start + n])
            page = self._page_of.get(key)
            if page is None:
                break
            if self._refs[page] == 0:
                del self._idle[page]
            self._refs[page] += 1
            pages.append(page)
        return pages

    def register(self, pages: Sequence[int], tokens: Sequence[int]) -> list[int]:
        """Record the whole pages of a sequence whose first len(tokens) positions are `tokens`;
        returns the page a later lookup finds for each of them (another copy of the same prefix,
        cached first, is kept), as far as the chain of cached pages goes."""
        key = b""
        n = self.page_size
        found: list[int] = []
        for i, page in enumerate(pages[: len(tokens) // n]):
            key = self.chain_key(key, tokens[i * n : (i + 1) * n])
            if key not in self._page_of and page not in self._key_of:
                self._key_of[page] = key
                self._page_of[key] = page
            cached = self._page_of.get(key)
            if cached is None:
                break  # this page already holds another prefix (cannot happen while it is ours)
            found.append(cached)
        return found

    # --- sessions ------------------------------------------------------------------------------

    def pin(self, session_id: str, pages: Sequence[int]) -> None:
        """`session_id` holds a reference to `pages` (its conversation so far), replacing any
        pages it held before."""
        for page in pages:
            self._refs[page] += 1
        old = self._sessions.pop(session_id, None)
        self._sessions[session_id] = list(pages)
        if old is not None:
            self.release(old)

    def touch(self, session_id: str) -> None:
        if session_id in self._sessions:
            self._sessions.move_to_end(session_id)

    def unpin(self, session_id: str) -> bool:
        pages = self._sessions.pop(session_id, None)
        if pages is None:
            return False
        self.release(pages)
        return True

    def drop_oldest_session(self) -> bool:
        """Release the least recently used session's pages (when pages run out)."""
        if not self._sessions:
            return False
        session_id = next(iter(self._sessions))
        return self.unpin(session_id)

    # --- views ---------------------------------------------------------------------------------

    def slots(self, pages: Sequence[int], n: int) -> Slots:
        """The slots of positions 0..n-1 of a sequence with page table `pages`."""
        table = np.asarray(pages, dtype=np.int32)
        pos = np.arange(n, dtype=np.int32)
        slots: Slots = table[pos // self.page_size] * self.page_size + pos % self.page_size
        return slots

    def stats(self) -> PageStats:
        usable = self.num_pages - 1
        in_use = sum(1 for page in range(1, self.num_pages) if self._refs[page] > 0)
        return PageStats(
            self.page_size, usable, in_use, len(self._idle), len(self._free), len(self._sessions)
        )
