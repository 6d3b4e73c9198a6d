"""The compiler's entry for a model description: the `llama` graph and the ones built on it.

llama, qwen2, qwen3 and gemma3 share one decoder graph (zinc.compiler.graph), switched by the
recipe fields of their `HParams`; this module keeps the names callers use (`emit_module`,
`build_module`, `cache_type`, `ENTRY_POINTS`). The entry-point signatures (the artifact contract)
are documented in zinc.compiler.graph.
Imports: zinc.compiler.graph.
"""

from __future__ import annotations

from zinc.compiler.graph import ENTRY_POINTS, build_module, cache_type, emit_module

__all__ = ["ENTRY_POINTS", "build_module", "cache_type", "emit_module"]
