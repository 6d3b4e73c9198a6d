"""Text stop sequences: cut generated text at the first stop string, never leaking a partial match.

Owns: `StopMatcher`. Text is fed in deltas; it returns what is safe to emit now and holds back
any tail that could still become a stop sequence (OpenAI semantics: the stop string itself is
not part of the output). `matched` names the stop string that ended the text (Anthropic's
`stop_sequence` reports it).
Imports: the stdlib only.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string found, once `stopped`

    def _holdback(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best

    def feed(self, delta: str) -> str:
        """Add generated text; returns the part that can be emitted. Sets `stopped` on a match."""
        if self.stopped:
            return ""
        text = self._held + delta
        hits = [(i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if hits:
            cut, self.matched = min(hits, key=lambda hit: hit[0])
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._holdback(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of generation, the held-back text was not a stop after all."""
        text, self._held = self._held, ""
        return "" if self.stopped else text
