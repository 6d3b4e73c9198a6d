"""Prefetching a layer's cached K/V rows from inside a decode step's matmul (the CPU path).

Owns: `KvPrefetch` (what one dispatch prefetches: the layer, its attention window, the slab's
shape and element type) and the MLIR fragments that turn a decode kernel of `dot8` into one that
also prefetches (the kernel's `bindings`, `index_args`, `setup` and `loop_lines`; the
dispatching func's `wrapper_params`, `wrapper_dims` and `dispatch_operands`): three more operands (the slab,
the rows' slots `ctx [R, S]` and their cached lengths `len [R]`) and, in each iteration of the
kernel's block loop, the `prefetcht1` (into L2) of every 64-byte line of one cached position's
K/V record for that layer. The record of (slot, layer) is `2 x Hkv x hd` contiguous elements of
the slot-major slab; iteration j of workgroup w of W takes item i = j W + w, row i mod R and the
(i div R)-th position inside the row's window, so the workgroups split the rows' positions and
each runs ahead of nothing but its own loop. A prefetch never faults and changes no value: the
kernel's results are bit for bit those of the kernel without it.

Why: decode attention reads every cached position of its layer once per step, one slot (23 KB
of every layer's rows, SmolLM2) apart, after the weights of a whole layer have gone through the
caches, so it waits on memory (about three times as long as with the rows in cache). A batch's
matmuls are bound by their arithmetic, so the memory system has time to spare while they run: the gate/up matmul
of layer l prefetches layer l + 1's rows (and the q/k/v matmul of layer 0 its own), and the
attention finds them in L2 or L3.
Imports: nothing but the stdlib (dataclasses).
"""

from __future__ import annotations

from dataclasses import dataclass

LOCALITY = 2  # memref.prefetch locality 2: prefetcht1, into L2 (as the matmuls' own weight prefetch)
LINE = 64  # bytes per cache line


@dataclass(frozen=True)
class KvPrefetch:
    """The K/V rows one dispatch prefetches: layer `layer`'s of the slab [NS, layers, 2, heads_kv,
    head_dim] x `dtype`, at the positions inside `window` (a sliding window's width, or the
    largest i32 for none) of each row's cached `len`."""

    layer: int
    window: int
    layers: int
    heads_kv: int
    head_dim: int
    dtype: str  # the slab's element type: f16 or f32

    @property
    def slab(self) -> str:
        return f"{self.layers}x2x{self.heads_kv}x{self.head_dim}x{self.dtype}"

    def tag(self) -> str:
        """A kernel-name suffix: kernels that differ only in the layer share one dispatch (the
        layer is an operand); the window is compiled in."""
        return f"_kvw{self.window}"


def bindings() -> str:
    """The kernel's extra bindings, placed after the activations' binding."""
    return "%b_cache: !stream.binding, %b_ctx: !stream.binding, %b_len: !stream.binding, "


def index_args() -> str:
    """The kernel's extra index arguments: the slab's slots, ctx's columns and the layer."""
    return ", %kv_ns: index, %kv_sn: index, %kv_layer: index"


def setup(kv: KvPrefetch, rows: int) -> str:
    """Kernel lines after the workgroup id (%wg): the three subspans and the constants."""
    lines = [
        f"%kv_cache = stream.binding.subspan %b_cache[%c0] : !stream.binding -> memref<?x{kv.slab}>{{%kv_ns}}",
        f"%kv_ctx = stream.binding.subspan %b_ctx[%c0] : !stream.binding -> memref<{rows}x?xi32>{{%kv_sn}}",
        f"%kv_len = stream.binding.subspan %b_len[%c0] : !stream.binding -> memref<{rows}xi32>",
        "%kv_nwg = stream.dispatch.workgroup.count[0] : index",
        f"%kv_rows = arith.constant {rows} : index",
        f"%kv_win = arith.constant {kv.window} : index",
        *(f"%kv_c{v} = arith.constant {v} : index" for v in sorted({v for line in _lines(kv) for v in line})),
    ]
    return "\n".join("    " + ln for ln in lines)


def loop_lines(kv: KvPrefetch, rows: int) -> list[str]:
    """Lines at the top of the block loop (iteration (%g - %g0) * B + %b of the workgroup): the
    prefetch of one position's record, when the item falls inside its row's window."""
    lines = [
        "%kv_j0 = arith.subi %g, %g0 : index",
        "%kv_j1 = arith.muli %kv_j0, %cB : index",
        "%kv_j = arith.addi %kv_j1, %b : index",
        "%kv_i0 = arith.muli %kv_j, %kv_nwg : index",
        "%kv_i = arith.addi %kv_i0, %wg : index",
        "%kv_r = arith.remui %kv_i, %kv_rows : index",
        "%kv_k = arith.divui %kv_i, %kv_rows : index",
        f"%kv_n32 = memref.load %kv_len[%kv_r] : memref<{rows}xi32>",
        "%kv_n = arith.index_cast %kv_n32 : i32 to index",
        # the window's first position: len + 1 - window, or 0 (as the attention masks them)
        "%kv_n1 = arith.addi %kv_n, %c1 : index",
        "%kv_far = arith.cmpi ugt, %kv_n1, %kv_win : index",
        "%kv_lbw = arith.subi %kv_n1, %kv_win : index",
        "%kv_lb = arith.select %kv_far, %kv_lbw, %c0 : index",
        "%kv_p = arith.addi %kv_lb, %kv_k : index",
        "%kv_end = arith.minui %kv_n, %kv_sn : index",
        "%kv_in = arith.cmpi ult, %kv_p, %kv_end : index",
        "scf.if %kv_in {",
        f"  %kv_s32 = memref.load %kv_ctx[%kv_r, %kv_p] : memref<{rows}x?xi32>",
        "  %kv_s = arith.index_cast %kv_s32 : i32 to index",
    ]
    mem = f"memref<?x{kv.slab}>"
    lines += [
        f"  memref.prefetch %kv_cache[%kv_s, %kv_layer, %kv_c{part}, %kv_c{h}, %kv_c{d}], read, "
        f"locality<{LOCALITY}>, data : {mem}"
        for part, h, d in _lines(kv)
    ]
    return [*lines, "}"]


def _lines(kv: KvPrefetch) -> list[tuple[int, int, int]]:
    """(K or V, head, element) of each cache line's first element in the layer's record of
    2 x Hkv x hd elements (contiguous in the slab; a record of a whole number of lines starts on
    a line, as the slab does, else its last element's line is added)."""
    per_line = LINE // (2 if kv.dtype == "f16" else 4)
    total = 2 * kv.heads_kv * kv.head_dim
    starts = [*range(0, total, per_line), *([total - 1] if total % per_line else [])]
    return [
        (e // (kv.heads_kv * kv.head_dim), e // kv.head_dim % kv.heads_kv, e % kv.head_dim) for e in starts
    ]


def wrapper_params(kv: KvPrefetch, rows: int) -> str:
    """The dispatching func's extra parameters, after the activations."""
    return f", %kv_cache: tensor<?x{kv.slab}>, %kv_ctx: tensor<{rows}x?xi32>, %kv_len: tensor<{rows}xi32>, %kv_layer: index"


def wrapper_dims(kv: KvPrefetch, rows: int) -> str:
    """Lines at the top of the dispatching func: the slab's and ctx's dynamic sizes."""
    return (
        "  %kv_c0 = arith.constant 0 : index\n  %kv_c1 = arith.constant 1 : index\n"
        f"  %kv_ns = tensor.dim %kv_cache, %kv_c0 : tensor<?x{kv.slab}>\n"
        f"  %kv_sn = tensor.dim %kv_ctx, %kv_c1 : tensor<{rows}x?xi32>\n"
    )


def dispatch_operands(kv: KvPrefetch, rows: int) -> tuple[str, str]:
    """The flow.dispatch's extra operands after the activations, and their types."""
    return (
        ", %kv_cache, %kv_ctx, %kv_len, %kv_ns, %kv_sn, %kv_layer",
        f", tensor<?x{kv.slab}>{{%kv_ns}}, tensor<{rows}x?xi32>{{%kv_sn}}, tensor<{rows}xi32>, index, index, index",
    )
