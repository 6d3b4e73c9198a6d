"""Integer dot-product matmuls for the CPU (x86-64 with AVX2): Q4_0/1, Q5_0/1, Q8_0, Q4_K, Q5_K, Q6_K.

Owns the kernels that read the grouped weight layout of zinc.compiler.dot8_layout (which this
module's `plane_types` and `repack` are, as zinc.compiler.emitter's `WeightLayout` asks of it):
  - decode (`render_decode`, one token or a static batch of rows): a hand-written dispatch
    (`mlir/dot8_decode.mlir`, a `stream.executable` IREE compiles as it is). Each workgroup first
    quantizes the activations per 32-block to int8 (scale `max|x| / 127`, round to nearest even,
    and the block sum for the types with a minimum or offset, as llama.cpp's Q8_1 / Q8_0), then multiplies
    with `vpmaddubsw` / `vpmaddwd` (LLVM intrinsics; `vpdpbusd` where the host has AVX-VNNI or
    AVX-512 VNNI, see dot8_layout `vnni()`), 8 output rows per vector, scales in f32 (Q5_0,
    Q5_1 and Q5_K: the fifth bits expanded from their word to a byte mask by a broadcast, an AND
    with 1 << row and a compare, then OR-ed into the nibbles as 16). Over a weight dot8_layout
    `paired` every kernel, one token's too, reads 16 output rows per `vpdpbusd` with single
    512-bit loads (`lanes`, `wide_enabled()`): half the instructions per product, and no shuffle
    to join two groups' loads (against the groups apart and joined in the kernel: SmolLM2's step
    of 8 rows 2.6-4% faster, of 4 rows 2-3%, Gemma 3's of 8 rows 2-8%; one token's within 1%);
  - prefill (`render_prefill`): the same dispatch over a prompt chunk, 8 rows per workgroup
    tile (1.7x the f32 dequantize + `linalg.matmul` it replaced, for a 128-token chunk).
Both prefetch the quants `PREFETCH_BLOCKS` blocks ahead of the block they multiply, into L2; a
decode kernel given a `KvPrefetch` also prefetches a layer's cached K/V rows for the attention
that comes after it (zinc.compiler.kv_prefetch: its operands and loop lines).
IREE's own codegen turns an i8 x i8 -> i32 contraction into scalar multiplies, which is why
these kernels name the instructions.
Imports: numpy, zinc.compiler.dot8_layout, zinc.compiler.kernels (QuantType, templates),
zinc.compiler.kv_prefetch, zinc.errors.
"""

from __future__ import annotations

import os
from string import Template

import numpy as np

from zinc.compiler import kv_prefetch
from zinc.compiler.dot8_layout import DOT8_TYPES, F32_SCALES, FIFTH_BIT, SUPER_BLOCK, G, lanes, vnni
from zinc.compiler.dot8_layout import plane_types as plane_types
from zinc.compiler.dot8_layout import repack as repack
from zinc.compiler.kernels import QuantType, template
from zinc.compiler.kv_prefetch import KvPrefetch
from zinc.errors import ZincError

PREFILL_ROWS = 8  # rows of a prompt chunk per workgroup tile
# Workgroups over a matrix's rows per dispatch (per 8-row tile of a prompt chunk), at least one
# per usable CPU (`_workgroups`). Each one quantizes its activation rows again and runs its own
# prefetch stream, which reaches `PREFETCH_BLOCKS` ahead only after its first blocks, so fewer and
# longer ones do better (measured in the commits that set these).
DECODE_WORKGROUPS, PREFILL_WORKGROUPS = 2, 2
# Over a large matrix (`SPLIT_BYTES` of weights or more) a batch of rows runs in `BATCH_SPLIT`
# workgroups per CPU and a prompt chunk in `PREFILL_SPLIT` per tile: these kernels are bound by
# arithmetic, and with few long workgroups a worker slowed by the host leaves the others idle
# until it is done. Each workgroup still has a long run of blocks.
BATCH_SPLIT, PREFILL_SPLIT, SPLIT_BYTES = 4, 8, 4 << 20
# Software prefetch of the quants this many blocks ahead (8 KB for the 4-bit types) into L2
# (`PREFETCH_LOCALITY` 2: prefetcht1): with the hardware prefetcher alone the kernels still wait on
# their reads. Into L2, not L1: an L1 prefetch holds one of the core's few L1 miss buffers until
# its line comes, and the batch kernels then wait on memory. 64 blocks beat 32 and 128.
PREFETCH_BLOCKS = 64
PREFETCH_LOCALITY = 2  # memref.prefetch locality: 3 is prefetcht0 (L1), 2 prefetcht1 (L2)
# Stack bytes a kernel's quantized activation rows may take (32 int8 and up to three f32 a 32-block
# a row): IREE's CPU backend refuses a function with more than 32 KiB of stack (its worker threads
# have 128 KiB). Past this the rows are quantized once by a dispatch of their own, into buffers the
# kernel reads (`quantized_apart`). One token's rows fit at every width of fixtures/real_shapes.py
# (18,944: 26 KB), and an 8-row tile's over SmolLM2's or Gemma 3 270M's widest rows (1536, 2048);
# over a 1B model's ffn_down (8192) they do not.
STACK_BUDGET = 28 * 1024


def _workgroups(prefill: bool, rows: int = 1, nbytes: int = 0) -> int:
    """Workgroups for a kernel over `nbytes` of weights: per tile for a prompt chunk (its tiles
    already give a 128-token chunk 32 workgroups); for a decode kernel of one row or a batch, at
    least one per usable CPU of the host the artifact is compiled for (and served on: it targets
    the host's CPU). Past `SPLIT_BYTES`, a prompt chunk's and a batch's split finer (above)."""
    if prefill:
        return PREFILL_SPLIT if nbytes >= SPLIT_BYTES else PREFILL_WORKGROUPS
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    per_cpu = BATCH_SPLIT if rows > 1 and nbytes >= SPLIT_BYTES else 1
    return max(DECODE_WORKGROUPS, cpus * per_cpu)


def decode_name(
    q: QuantType, n: int, k: int, rows: int = 0, kv: KvPrefetch | None = None, parts: tuple[int, ...] = ()
) -> str:
    tail = f"{kv.tag() if kv else ''}{'_p' + 'x'.join(map(str, parts)) if parts else ''}"
    return f"dot8_{q.name.lower()}_{f'b{rows}' if rows else '1'}_{n}x{k}{tail}"


def splits(q: QuantType, n: int, rows: int, parts: tuple[int, ...]) -> bool:
    """Whether a kernel of `rows` rows (more than one) can write its output part-major for
    `parts` (their sizes, summing to n): every part a whole number of output vectors."""
    return rows > 1 and sum(parts) == n and all(p % lanes(q, n, rows) == 0 for p in parts)


def _part_major_stores(r: int, n: int, v: int, parts: tuple[int, ...]) -> list[str]:
    """The stores of a kernel whose output [r, n] is several matrices side by side (q, k and v)
    written part-major: part j, columns s_j.. of width n_j, is the [r, n_j] block at flat offset
    r * s_j, so each part is contiguous and a slice of it, not a strided copy (`splits`). The
    output vector at columns n0.. of row i goes to flat r * s + i * n_j + (n0 - s), stored at
    [that / n, that % n] of the same [r, n] memref."""
    lines = ["      %pst0 = arith.constant 0 : index", f"      %pn0 = arith.constant {parts[0]} : index"]
    start = 0
    for j, size in enumerate(parts[1:], 1):
        start += parts[j - 1]
        lines += [
            f"      %ps{j} = arith.constant {start} : index",
            f"      %psz{j} = arith.constant {size} : index",
            f"      %pge{j} = arith.cmpi uge, %n0, %ps{j} : index",
            f"      %pst{j} = arith.select %pge{j}, %ps{j}, %pst{j - 1} : index",
            f"      %pn{j} = arith.select %pge{j}, %psz{j}, %pn{j - 1} : index",
        ]
    last = len(parts) - 1
    lines += [
        f"      %pN = arith.constant {n} : index",
        f"      %pbase = arith.muli %pst{last}, %cR : index",
        f"      %pin = arith.subi %n0, %pst{last} : index",
        "      %poff = arith.addi %pbase, %pin : index",
    ]
    for i in range(r):
        acc = f"%acc#{i}"
        lines += [
            f"      %prow{i} = arith.muli %pn{last}, %c{i} : index",
            f"      %pf{i} = arith.addi %poff, %prow{i} : index",
            f"      %py{i} = arith.divui %pf{i}, %pN : index",
            f"      %px{i} = arith.remui %pf{i}, %pN : index",
            f"      vector.store {acc}, %y[%py{i}, %px{i}] : memref<{r}x{n}xf32>, vector<{v}xf32>",
        ]
    return lines


def _x_lines(r: int, xs: int, v: int = G) -> list[str]:
    """`%x{r}_{xs}`: the 4 quantized activations of row r at byte 4 * xs of the block, repeated
    across the vector's 4 v bytes so that each of its v weight rows meets them."""
    x = f"%x{r}_{xs}"
    return [
        f"{x}a = vector.load %xq[%xr{r}, %b, %c{4 * xs}] : memref<${{XQ}}>, vector<4xi8>",
        f"{x}b = vector.bitcast {x}a : vector<4xi8> to vector<1xi32>",
        f"{x}c = vector.broadcast {x}b : vector<1xi32> to vector<{v}xi32>",
        f"{x} = vector.bitcast {x}c : vector<{v}xi32> to vector<{4 * v}xi8>",
    ]


def _avx2_sums(q: QuantType, r: int) -> tuple[list[str], str, str]:
    """Row r's integer sums over one block: `vpmaddubsw` into i16 pairs, `vpmaddwd` into i32
    (signed weights as |w| times x with w's sign; Q5_0's i16 sums are widened after loads 0 and 1
    and again after 2 and 3, before they could saturate). Returns the lines, Q6_K's first-half sum
    and the sum (vector<8xi32>, one lane per output row of the group)."""
    lines: list[str] = []
    if q.name == "Q6_K":  # per half: loads 0 and 1, then 2 and 3 (2 * 63 * 127 a pair sum) widened
        half_sums: list[str] = []
        for half, base in (("lo", 0), ("hi", 4)):
            words = []
            for pair in ((0, 1), (2, 3)):
                for s in pair:
                    lines += _x_lines(r, base + s)
                    x = f"%x{r}_{base + s}"
                    lines.append(f"%p{r}_{base + s} = {_intr('pmadd.ub.sw', f'%{half}{s}', x, '32xi8', '16xi16')}")
                lines.append(
                    f"%q{r}{half}{pair[0]} = arith.addi %p{r}_{base + pair[0]}, %p{r}_{base + pair[1]} : vector<16xi16>"
                )
                lines.append(f"%qw{r}{half}{pair[0]} = {_intr('pmadd.wd', f'%q{r}{half}{pair[0]}', '%ones', '16xi16', '8xi32')}")
                words.append(f"%qw{r}{half}{pair[0]}")
            lines.append(f"%i{r}{half} = arith.addi {words[0]}, {words[1]} : vector<8xi32>")
            half_sums.append(f"%i{r}{half}")
        return lines, half_sums[0], half_sums[1]
    four = DOT8_TYPES[q.name] == 4
    halves16 = q.name == "Q6_K"
    five = q.name in FIFTH_BIT
    first = ""
    acc = ""
    halves = [(s, s, f"lo{s}") for s in range(4)] + [(s, 4 + s, f"hi{s}") for s in range(4)]
    if five:  # loads 0 and 1, then 2 and 3: 4 pair sums of at most 2 * 31 * 127 fit in i16
        halves = [(s, xs, f"{half}{s}") for s in range(4) for xs, half in ((s, "lo"), (4 + s, "hi"))]
    parts = halves if four else [(s, s, f"w{s}") for s in range(8)]
    for j, (s, xs, w) in enumerate(parts):
        if five and j == 4:  # widen the first four i16 sums to i32 before they could saturate
            lines.append(f"%i{r}a = {_intr('pmadd.wd', acc, '%ones', '16xi16', '8xi32')}")
            acc = ""
        p = f"%p{r}_{xs}"
        lines += _x_lines(r, xs)
        if four:
            lines.append(f"{p} = {_intr('pmadd.ub.sw', f'%{w}', f'%x{r}_{xs}', '32xi8', '16xi16')}")
        else:  # signed weights: |w| times x with w's sign, the unsigned x signed form vpmaddubsw takes
            lines += [
                f"%sx{r}_{xs} = {_intr('psign.b', f'%x{r}_{xs}', f'%w{s}', '32xi8', '32xi8')}",
                f"%u{r}_{xs} = {_intr('pmadd.ub.sw', f'%aw{s}', f'%sx{r}_{xs}', '32xi8', '16xi16')}",
                f"{p} = {_intr('pmadd.wd', f'%u{r}_{xs}', '%ones', '16xi16', '8xi32')}",
            ]
        if acc and not (halves16 and xs == 4):  # 4-bit: 8 pair sums of at most 2 * 15 * 127 fit in i16
            lines.append(f"%s{r}_{xs} = arith.addi {acc}, {p} : vector<{'16xi16' if four else '8xi32'}>")
            acc = f"%s{r}_{xs}"
        else:  # Q6_K: the second 16 weights of the block start a second sum (their own scale)
            first, acc = acc, p
    if five:
        lines += [
            f"%i{r}b = {_intr('pmadd.wd', acc, '%ones', '16xi16', '8xi32')}",
            f"%i{r} = arith.addi %i{r}a, %i{r}b : vector<8xi32>",
        ]
        acc = f"%i{r}"
    elif four:  # the i16 sums of each row's 4-byte groups, added pairwise into i32
        lines.append(f"%i{r} = {_intr('pmadd.wd', acc, '%ones', '16xi16', '8xi32')}")
        acc = f"%i{r}"
    return lines, first, acc


def _vnni_sums(q: QuantType, r: int, v: int = G) -> tuple[list[str], str, str]:
    """The same with `vpdpbusd` (u8 x s8, 4 products per i32 lane, accumulated in one instruction;
    no i16 step, so nothing can saturate), in v lanes (256 or 512 bits). AVX-512 has no `vpsignb`:
    there x takes w's sign by a compare and a select (x is never -128, so -x fits)."""
    lines: list[str] = []
    four = DOT8_TYPES[q.name] == 4
    parts = [(s, s, f"lo{s}") for s in range(4)] + [(s, 4 + s, f"hi{s}") for s in range(4)]
    if not four:
        parts = [(s, s, f"aw{s}") for s in range(8)]
    acc, first = "%zi8", ""
    for s, xs, w in parts:
        x = f"%x{r}_{xs}"
        lines += _x_lines(r, xs, v)
        if not four and v == G:  # signed weights: |w| times x with w's sign
            lines.append(f"{x}s = {_intr('psign.b', x, f'%w{s}', '32xi8', '32xi8')}")
            x = f"{x}s"
        elif not four:
            vb = f"vector<{4 * v}xi8>"
            lines += [
                f"{x}n = arith.subi %zb, {x} : {vb}",
                f"{x}s = arith.select %neg{s}, {x}n, {x} : vector<{4 * v}xi1>, {vb}",
            ]
            x = f"{x}s"
        if q.name == "Q6_K" and xs == 4:  # the second 16 weights of the block: their own scale
            first, acc = acc, "%zi8"
        lines.append(
            f'%s{r}_{xs} = llvm.call_intrinsic "llvm.x86.avx512.vpdpbusd.{32 * v}"({acc}, %{w}, {x}) '
            f": (vector<{v}xi32>, vector<{4 * v}xi8>, vector<{4 * v}xi8>) -> vector<{v}xi32>"
        )
        acc = f"%s{r}_{xs}"
    return lines, first, acc


def _load_lines(q: QuantType, rows: int, v: int = G) -> str:
    """Per block of a group: the 32-byte loads, per row the integer sums (`_vnni_sums` where the
    host has VNNI, else `_avx2_sums`) and the scaled f32 accumulation. Q5_0's quants are the
    nibbles with 16 added where the fifth bit is set (0..31, the -16 is the offset term).
    With v = 16 lanes a vector holds the same load of the two groups of pair %g (`_group_load`)."""
    lines: list[str] = []
    vb, vi, vf = f"vector<{4 * v}xi8>", f"vector<{v}xi32>", f"vector<{v}xf32>"
    four = DOT8_TYPES[q.name] == 4
    halves16 = q.name == "Q6_K"
    five = q.name in FIFTH_BIT
    lines += _prefetch_lines(q, v)
    for s in range(DOT8_TYPES[q.name]):
        lines += _group_load(f"%w{s}", "%wq", f"%b, %c{s}, %c0", "${QS}", "32xi8", v)
        if five:  # nibble | 16 where the half's word has bit r in byte i (see _q5_0_fifth_bits)
            for h, half in enumerate(("lo", "hi")):
                hv = f"{half}{s}"
                lines.append(
                    f"%{hv}n = arith.andi %w{s}, %m15 : {vb}"
                    if h == 0
                    else f"%{hv}n = arith.shrui %w{s}, %c4v : {vb}"
                )
                if v == G:
                    lines += [
                        f"%{hv}h = memref.load %wh[%g, %b, %c{s}, %c{h}] : memref<${{QH}}>",
                        f"%{hv}hv = vector.broadcast %{hv}h : i32 to vector<8xi32>",
                    ]
                else:  # each group's word over its own 8 lanes
                    lines += [
                        f"%{hv}ha_ = memref.load %wh[%ga, %b, %c{s}, %c{h}] : memref<${{QH}}>",
                        f"%{hv}hb_ = memref.load %wh[%gb, %b, %c{s}, %c{h}] : memref<${{QH}}>",
                        f"%{hv}hva = vector.broadcast %{hv}ha_ : i32 to vector<8xi32>",
                        f"%{hv}hvb = vector.broadcast %{hv}hb_ : i32 to vector<8xi32>",
                        f"%{hv}hv = vector.shuffle %{hv}hva, %{hv}hvb [{', '.join(map(str, range(16)))}] "
                        ": vector<8xi32>, vector<8xi32>",
                    ]
                lines += [
                    f"%{hv}hb = vector.bitcast %{hv}hv : {vi} to {vb}",
                    f"%{hv}ha = arith.andi %{hv}hb, %bitr : {vb}",
                    f"%{hv}hm = arith.cmpi eq, %{hv}ha, %bitr : {vb}",
                    f"%{hv}h16 = arith.select %{hv}hm, %c16v, %c0v : vector<{4 * v}xi1>, {vb}",
                    f"%{hv} = arith.ori %{hv}n, %{hv}h16 : {vb}",
                ]
        elif halves16:  # the nibbles with the 2-bit highs of load s from bits 4t, 4t + 2 of load p
            pl, t_ = divmod(s, 2)
            if t_ == 0:
                lines += _group_load(f"%hb{pl}", "%whb", f"%b, %c{pl}, %c0", "${HB}", "32xi8", v)
            hi_h = f"arith.shli %hb{pl}, %c2v : {vb}" if t_ == 0 else f"arith.shrui %hb{pl}, %c2v : {vb}"
            lines += [
                f"%lo{s}n = arith.andi %w{s}, %m15 : {vb}",
                f"%hi{s}n = arith.shrui %w{s}, %c4v : {vb}",
                *([f"%lo{s}s = arith.shli %hb{pl}, %c4v : {vb}"] if t_ == 0 else []),
                f"%hi{s}s = {hi_h}",
                f"%lo{s}h = arith.andi {f'%lo{s}s' if t_ == 0 else f'%hb{pl}'}, %m48 : {vb}",
                f"%hi{s}h = arith.andi %hi{s}s, %m48 : {vb}",
                f"%lo{s} = arith.ori %lo{s}n, %lo{s}h : {vb}",
                f"%hi{s} = arith.ori %hi{s}n, %hi{s}h : {vb}",
            ]
        elif four:
            lines += [
                f"%lo{s} = arith.andi %w{s}, %m15 : {vb}",
                f"%hi{s} = arith.shrui %w{s}, %c4v : {vb}",
            ]
        else:
            lines.append(f"%aw{s} = math.absi %w{s} : {vb}")
            if v != G:
                lines.append(f"%neg{s} = arith.cmpi slt, %w{s}, %zb : {vb}")
    for r in range(rows):
        sums, first, acc = _vnni_sums(q, r, v) if vnni() else _avx2_sums(q, r)
        lines += sums
        lines += [
            f"%dx{r} = memref.load %dx[%xr{r}, %b] : memref<${{DX}}>",
            f"%dxv{r} = vector.broadcast %dx{r} : f32 to {vf}",
            f"%t{r} = arith.mulf %dw, %dxv{r} : {vf}",
        ]
        if halves16:
            lines += [
                f"%fa{r} = arith.sitofp {first} : {vi} to {vf}",
                f"%ax{r} = math.fma %fa{r}, %t{r}, %acc{r} : {vf}",
                f"%f{r} = arith.sitofp {acc} : {vi} to {vf}",
                f"%t2{r} = arith.mulf %d2w, %dxv{r} : {vf}",
                f"%a{r}z = math.fma %f{r}, %t2{r}, %ax{r} : {vf}",
                # - 32 d sum(x) per half, sum(x) as d_x * sum(q_x): the first half's (sh) and the rest
                f"%sh{r} = memref.load %sh[%xr{r}, %b] : memref<${{DX}}>",
                f"%sx{r} = memref.load %sx[%xr{r}, %b] : memref<${{DX}}>",
                f"%sd{r} = arith.subf %sx{r}, %sh{r} : f32",
                f"%shv{r} = vector.broadcast %sh{r} : f32 to {vf}",
                f"%sdv{r} = vector.broadcast %sd{r} : f32 to {vf}",
                f"%a{r}w = math.fma %mw, %shv{r}, %a{r}z : {vf}",
                f"%a{r} = math.fma %m2w, %sdv{r}, %a{r}w : {vf}",
            ]
            continue
        lines += [
            f"%f{r} = arith.sitofp {acc} : {vi} to {vf}",
            f"%a{r}{'' if q.name == 'Q8_0' else 'x'} = math.fma %f{r}, %t{r}, %acc{r} : {vf}",
        ]
        # + m * sum(x) (Q4_1, Q5_1, Q4_K, Q5_K), - 8 d * sum(x) (Q4_0) or - 16 d * sum(x) (Q5_0),
        # sum(x) as d_x * sum(q_x)
        if q.name != "Q8_0":
            lines += [
                f"%sx{r} = memref.load %sx[%xr{r}, %b] : memref<${{DX}}>",
                f"%sxv{r} = vector.broadcast %sx{r} : f32 to {vf}",
                f"%a{r} = math.fma %mw, %sxv{r}, %a{r}x : {vf}",
            ]
    return "\n".join("          " + ln for ln in lines)


def prefetch_blocks() -> int:
    """How many blocks ahead of the one being multiplied the kernels prefetch the quants of
    (`PREFETCH_BLOCKS`; `ZINC_CPU_PREFETCH` sets it, 0 turns prefetching off)."""
    raw = os.environ.get("ZINC_CPU_PREFETCH", "")
    if raw and not raw.isdigit():
        raise ZincError(f"ZINC_CPU_PREFETCH must be a whole number of blocks (0: off), got {raw!r}")
    return int(raw) if raw else PREFETCH_BLOCKS


def _prefetch_lines(q: QuantType, v: int) -> list[str]:
    """`memref.prefetch` of each 64-byte line of the quants `prefetch_blocks()` blocks ahead in
    every group of the vector. A group's blocks are contiguous and the groups of a workgroup
    follow each other, so past a group's last block this is the next group's first: one stream
    ahead of the loads. A prefetch never faults, so the last groups' run past the plane is harmless."""
    ahead = prefetch_blocks()
    if not ahead:
        return []
    lines = [f"%cpf = arith.constant {ahead} : index", "%bpf = arith.addi %b, %cpf : index"]
    step = 2 if v == G else 1  # a line: two 32-byte loads of a group, or one 64-byte load of a pair
    return lines + [
        f"memref.prefetch %wq[%g, %bpf, %c{s}, %c0], read, locality<{PREFETCH_LOCALITY}>, data : memref<${{QS}}>"
        for s in range(0, DOT8_TYPES[q.name], step)
    ]


def _group_load(out: str, mem: str, idx: str, shape: str, ty: str, v: int) -> list[str]:
    """`out`: the vector<`ty`> (one group's) at `idx` of group %g of `mem` (v = 8 lanes), or twice
    as long, the pair %g's two groups side by side (v = 16: one 512-bit load of paired planes)."""
    n, el = ty.split("x")
    return [f"{out} = vector.load {mem}[%g, {idx}] : memref<{shape}>, vector<{int(n) * v // G}x{el}>"]


def _intr(name: str, a: str, b: str, ty: str, out: str) -> str:
    return f'llvm.call_intrinsic "llvm.x86.avx2.{name}"({a}, {b}) : (vector<{ty}>, vector<{ty}>) -> vector<{out}>'


def render_decode(
    q: QuantType, n: int, k: int, rows: int = 0, kv: KvPrefetch | None = None, parts: tuple[int, ...] = ()
) -> str:
    """A `stream.executable` and the private func `y[R, n] = x[R, k] @ W[n, k]^T` dispatching it
    (R = `rows`, or 1 for the single-token decode). With `kv`, the kernel also prefetches a
    layer's cached K/V rows of its R rows (zinc.compiler.kv_prefetch), and the func takes the
    slab, the rows' slots, their cached lengths and the layer after x. With `parts` (`splits`
    holds), y is written part-major (`_part_major_stores`)."""
    r = rows or 1
    b = k // 32
    operands, operand_types = _operands(q, n, k)
    name = decode_name(q, n, k, rows, kv, parts)
    kv_ops, kv_types = kv_prefetch.dispatch_operands(kv, r) if kv else ("", "")
    wrapper = (
        f"func.func private @{name}({_args(q, n, k)}, %x: tensor<{r}x{k}xf32>"
        f"{kv_prefetch.wrapper_params(kv, r) if kv else ''}) -> tensor<{r}x{n}xf32> {{\n"
        f"{kv_prefetch.wrapper_dims(kv, r) if kv else ''}"
        f"  %xb = tensor.expand_shape %x [[0], [1, 2]] output_shape [{r}, {b}, 32] "
        f": tensor<{r}x{k}xf32> into tensor<{r}x{b}x32xf32>\n"
        f"{_quantize_call(q, name, r, k, '')}"
        f"  %y = flow.dispatch @{name}_ex::@{name}({operands}, {_x_operands(q, r, k)}{kv_ops}) "
        f": ({operand_types}, {_x_types(q, r, k, str(r), '')}{kv_types}) -> tensor<{r}x{n}xf32>\n"
        f"  return %y : tensor<{r}x{n}xf32>\n}}\n"
    )
    return _render(q, n, k, name, r, wrapper, prefill=False, kv=kv, parts=parts)


def render_prefill(q: QuantType, n: int, k: int) -> str:
    """The same for a prompt chunk: x [T, k] padded with zero rows to a multiple of 8, a tile of
    8 rows per workgroup, the weight groups of a workgroup read from cache for every tile."""
    b, name = k // 32, prefill_name(q, n, k)
    operands, operand_types = _operands(q, n, k)
    wrapper = f"""func.func private @{name}({_args(q, n, k)}, %x: tensor<?x{k}xf32>) -> tensor<?x{n}xf32> {{
  %c0 = arith.constant 0 : index
  %c7 = arith.constant 7 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant 0.0 : f32
  %T = tensor.dim %x, %c0 : tensor<?x{k}xf32>
  %t7 = arith.addi %T, %c7 : index
  %tq = arith.divui %t7, %c8 : index
  %Tp = arith.muli %tq, %c8 : index
  %extra = arith.subi %Tp, %T : index
  %xp = tensor.pad %x low[0, 0] high[%extra, 0] {{
  ^bb0(%i: index, %j: index):
    tensor.yield %zero : f32
  }} : tensor<?x{k}xf32> to tensor<?x{k}xf32>
  %xb = tensor.expand_shape %xp [[0], [1, 2]] output_shape [%Tp, {b}, 32] : tensor<?x{k}xf32> into tensor<?x{b}x32xf32>
{_quantize_call(q, name, PREFILL_ROWS, k, "%Tp")}  %yp = flow.dispatch @{name}_ex::@{name}[%Tp]({operands}, {_x_operands(q, PREFILL_ROWS, k)}, %Tp) : ({operand_types}, {_x_types(q, PREFILL_ROWS, k, "?", "{%Tp}")}, index) -> tensor<?x{n}xf32>{{%Tp}}
  %y = tensor.extract_slice %yp[0, 0] [%T, {n}] [1, 1] : tensor<?x{n}xf32> to tensor<?x{n}xf32>
  return %y : tensor<?x{n}xf32>
}}
"""
    return _render(q, n, k, name, PREFILL_ROWS, wrapper, prefill=True)


def _scale_load(q: QuantType, plane: str, out: str, v: int = G) -> str:
    """Lines loading the v rows' scales of block %b of group %g (v = 16: groups %ga, %ga + 1)
    from `plane` as f32 `out`."""
    f32 = q.name in F32_SCALES
    raw = out if f32 else f"{out}bits"
    lines = _group_load(raw, plane, "%b, %c0", "${DS}", "8xf32" if f32 else "8xi16", v)
    if not f32:
        p = out.lstrip("%")
        lines += [
            f"%{p}h = arith.bitcast %{p}bits : vector<{v}xi16> to vector<{v}xf16>",
            f"{out} = arith.extf %{p}h : vector<{v}xf16> to vector<{v}xf32>",
        ]
    return "\n          ".join(lines)


def _fifth_bit_consts(v: int) -> list[str]:
    """The constants that OR the fifth bits into the Q5 types' nibbles (`_load_lines`):
    byte 4r + i of a vector tests bit r of its word."""
    bitr = ", ".join(str(np.int8(np.uint8(1 << (i % 32 // 4)))) for i in range(4 * v))
    return [
        f"%bitr = arith.constant dense<[{bitr}]> : vector<{4 * v}xi8>",
        f"%c16v = arith.constant dense<16> : vector<{4 * v}xi8>",
        f"%c0v = arith.constant dense<0> : vector<{4 * v}xi8>",
    ]


def _q4_k_scales(v: int) -> tuple[str, str]:
    """Q4_K's and Q5_K's lines for the v rows' scale `%dw` and minimum `%mw` of block %b: the
    byte of each (`sc`) times the super-block's d or -dmin (f16 bits, one per 8 blocks), exact
    in f32."""
    f16 = []
    for plane, out in (("%wd", "%dsup"), ("%wm", "%msup")):
        f16 += [
            *_group_load(f"{out}bits", plane, "%b8, %c0", "${DS}", "8xi16", v),
            f"{out}h = arith.bitcast {out}bits : vector<{v}xi16> to vector<{v}xf16>",
            f"{out} = arith.extf {out}h : vector<{v}xf16> to vector<{v}xf32>",
        ]
    dscale = [
        "%c3q = arith.constant 3 : index",
        "%b8 = arith.shrui %b, %c3q : index",
        *f16,
        *_group_load("%scd", "%wsc", "%b, %c0, %c0", "${SC}", "8xi8", v),
        f"%scdf = arith.sitofp %scd : vector<{v}xi8> to vector<{v}xf32>",
        f"%dw = arith.mulf %scdf, %dsup : vector<{v}xf32>",
    ]
    mscale = [
        *_group_load("%scm", "%wsc", "%b, %c1, %c0", "${SC}", "8xi8", v),
        f"%scmf = arith.sitofp %scm : vector<{v}xi8> to vector<{v}xf32>",
        f"%mw = arith.mulf %scmf, %msup : vector<{v}xf32>",
    ]
    return "\n          ".join(dscale), "\n          ".join(mscale)


def _args(q: QuantType, n: int, k: int) -> str:
    return ", ".join(f"%w_{p}: {t}" for p, t in plane_types(q, n, k).items())


def _operands(q: QuantType, n: int, k: int) -> tuple[str, str]:
    types = plane_types(q, n, k)
    return ", ".join(f"%w_{p}" for p in types), ", ".join(types.values())


def _render(
    q: QuantType,
    n: int,
    k: int,
    name: str,
    r: int,
    wrapper: str,
    prefill: bool,
    kv: KvPrefetch | None = None,
    parts: tuple[int, ...] = (),
) -> str:
    ng, b, loads = n // G, k // 32, DOT8_TYPES[q.name]
    v = lanes(q, n, r)
    units = ng // (v // G)  # the loop's steps: groups, or pairs of groups side by side
    per_wg = max(1, -(-units // _workgroups(prefill, r, n * k // q.block * q.block_bytes)))
    nwg = -(-units // per_wg)
    types = plane_types(q, n, k)
    dscale = _scale_load(q, "%wd", "%dw", v)
    if q.name == "Q6_K":  # d * sc of each half, and -32 times it (the quants are stored unsigned)
        dscale = "\n          ".join([
            "%c3q = arith.constant 3 : index",
            "%b8 = arith.shrui %b, %c3q : index",
            *_group_load("%dsup", "%wd", "%b8, %c0", "${DS}", "8xf32", v),
            *_group_load("%sclo", "%wsc", "%b, %c0, %c0", "${SC}", "8xi8", v),
            *_group_load("%schi", "%wsc", "%b, %c1, %c0", "${SC}", "8xi8", v),
            f"%sclof = arith.sitofp %sclo : vector<{v}xi8> to vector<{v}xf32>",
            f"%schif = arith.sitofp %schi : vector<{v}xi8> to vector<{v}xf32>",
            f"%dw = arith.mulf %sclof, %dsup : vector<{v}xf32>",
            f"%d2w = arith.mulf %schif, %dsup : vector<{v}xf32>",
        ])
        mscale = "\n          ".join([
            f"%m32 = arith.constant dense<-32.0> : vector<{v}xf32>",
            f"%mw = arith.mulf %dw, %m32 : vector<{v}xf32>",
            f"%m2w = arith.mulf %d2w, %m32 : vector<{v}xf32>",
            f"%m48 = arith.constant dense<48> : vector<{4 * v}xi8>",
            f"%c2v = arith.constant dense<2> : vector<{4 * v}xi8>",
        ])  # fmt: skip
    elif q.name in ("Q4_K", "Q5_K"):  # the block's scale d * sc and minimum -dmin * m, d and dmin per 256
        dscale, mscale = _q4_k_scales(v)
        if q.name == "Q5_K":
            mscale = "\n          ".join([mscale, *_fifth_bit_consts(v)])
    elif q.name in ("Q4_1", "Q5_1"):
        five = _fifth_bit_consts(v) if q.name == "Q5_1" else []
        mscale = "\n          ".join([_scale_load(q, "%wm", "%mw", v), *five])
    elif q.name == "Q4_0":
        mscale = f"%mw = arith.mulf %dw, %m8 : vector<{v}xf32>"
    elif q.name == "Q5_0":  # -16 d, and the constants that add the fifth bits
        mscale = "\n          ".join([
            f"%m16 = arith.constant dense<-16.0> : vector<{v}xf32>",
            f"%mw = arith.mulf %dw, %m16 : vector<{v}xf32>",
            *_fifth_bit_consts(v),
        ])  # fmt: skip
    else:
        mscale = ""
    consts = "\n".join(f"    %c{i} = arith.constant {i} : index" for i in range(max(32, r)))
    xr = "?" if prefill else str(r)
    apart = quantized_apart(r, k)
    scale = "f32" if q.name in F32_SCALES else "i16"
    shapes = {  # the planes (a pair of groups per unit where v = 16, see dot8_layout `_pair`)
        "QS": f"{units}x{b}x{loads}x{4 * v}xi8",
        "DS": f"{units}x{b // 8 if q.name in SUPER_BLOCK else b}x{v}x{scale}",
        "HB": f"{units}x{b}x2x{4 * v}xi8",
        "SC": f"{units}x{b}x2x{v}xi8",
        "XQ": f"{xr if apart else r}x{b}x32xi8",
        "DX": f"{xr if apart else r}x{b}xf32",
        "QH": f"{ng}x{b}x4x2xi32",
    }
    if parts and not splits(q, n, r, parts):
        raise ZincError(f"dot8: cannot write a {r}-row [{n}] output part-major as {parts}")
    stores = _part_major_stores(r, n, v, parts) if parts else []
    for i in range(0 if parts else r):
        acc = f"%acc#{i}" if r > 1 else "%acc0"
        stores += [
            f"      %ry{i} = arith.addi %r0, %c{i} : index",
            f"      vector.store {acc}, %y[%ry{i}, %n0] : memref<{xr}x{n}xf32>, vector<{v}xf32>",
        ]
    text = template("dot8_decode.mlir").substitute(
        **shapes,
        NAME=name, PER_WG=str(per_wg), NG=str(units), VL=str(v), VB=str(4 * v), R=str(r), B=str(b), K=str(k), N=str(n), XR=xr,
        WG_ARGS="%tp: index" if prefill else "",
        WG_COUNT=(f"    %c{r}w = arith.constant {r} : index\n    %nwg = arith.constant {nwg} : index\n"
                  f"    %tiles = arith.divui %tp, %c{r}w : index\n    %x = arith.muli %tiles, %nwg : index"
                  if prefill else f"    %x = arith.constant {nwg} : index"),
        WG_IDS=("    %id = stream.dispatch.workgroup.id[0] : index\n    %tiles = arith.divui %tp, %c8 : index\n"
                "    %tile = arith.remui %id, %tiles : index\n    %wg = arith.divui %id, %tiles : index"
                if prefill else "    %tile = arith.constant 0 : index\n    %wg = stream.dispatch.workgroup.id[0] : index"),
        TP_ARG=", %tp: index" if prefill else "", TP="{%tp}" if prefill else "",
        CONSTS=consts, ITER_INIT=", ".join(f"%acc{i} = %zf" for i in range(r)),
        ITER_TYPES=", ".join([f"vector<{v}xf32>"] * r), YIELD=", ".join(f"%a{i}" for i in range(r)),
        YIELD_TYPES=", ".join([f"vector<{v}xf32>"] * r), RESULTS=f"%acc:{r}" if r > 1 else "%acc0",
        STORES="\n".join(stores), BINDINGS=", ".join(f"%b_{p}: !stream.binding" for p in types),
        WM="\n".join(
            f"    %{v} = stream.binding.subspan %b_{p}[%c0] : !stream.binding -> memref<${{{shape}}}>"
            for p, v, shape in (("m", "wm", "DS"), ("hb", "whb", "HB"), ("sc", "wsc", "SC"), ("qh", "wh", "QH"))
            if p in types
        ),
        DSCALE=dscale, MSCALE=mscale, BODY=_load_lines(q, r, v), WRAPPER=wrapper,
        X_BINDINGS=", ".join(f"%b_{p}: !stream.binding" for p in (_x_planes(q) if apart else ("x",))),
        X_SETUP=_x_setup(q, r, b, xr, "{%tp}" if prefill else "", apart),
        KV_BINDINGS=kv_prefetch.bindings() if kv else "", KV_ARGS=kv_prefetch.index_args() if kv else "",
        KV_SETUP=kv_prefetch.setup(kv, r) if kv else "",
        KV_PREFETCH="\n".join("          " + ln for ln in kv_prefetch.loop_lines(kv, r)) if kv else "",
    )  # fmt: skip
    for key, val in shapes.items():
        text = text.replace("${" + key + "}", val)  # the memref shapes inside the inserted fragments
    return _quantize_executable(q, name, r, k, prefill) + text if apart else text


def quantized_apart(rows: int, k: int) -> bool:
    """Whether a kernel over `rows` activation rows of width `k` reads them quantized by a
    dispatch before it (`STACK_BUDGET`) instead of quantizing them on its own stack."""
    return rows * (k // 32) * 44 > STACK_BUDGET


def _quantize_block(x_row: str, q_row: str, xm: str, xq: str, dx: str, halves: bool) -> str:
    """mlir/dot8_quantize_block.mlir (its comment lines left out) for one row of x; with `halves`
    (Q6_K, whose quants are stored unsigned) also d_x times the sum of the first 16, into %sh."""
    body = template("dot8_quantize_block.mlir").template
    lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("//")]
    if halves:
        lines += [
            "        %qs16 = vector.reduction <add>, %p01 : vector<8xi32> into i32",
            "        %qs16f = arith.sitofp %qs16 : i32 to f32",
            "        %sh16 = arith.mulf %qs16f, %d : f32",
            "        memref.store %sh16, %sh[${Q_ROW}, %b] : memref<${DX}>",
        ]
    return Template("\n".join(lines)).substitute(X_ROW=x_row, Q_ROW=q_row, XM=xm, XQ=xq, DX=dx)


def _x_planes(q: QuantType) -> tuple[str, ...]:
    """The quantized activation buffers a kernel of type `q` reads: the quants, d_x and d_x * sum
    of each block, and for Q6_K d_x * sum of its first 16."""
    return ("xq", "dx", "sx", "sh") if q.name == "Q6_K" else ("xq", "dx", "sx")


def _x_setup(q: QuantType, r: int, b: int, xr: str, td: str, apart: bool) -> str:
    """The kernel's quantized rows: its bound buffers (`quantized_apart`), or stack buffers it
    fills from x; and `%xr{i}`, the row of those buffers that the tile's row i is."""
    if apart:
        lines = [
            f"    %{p} = stream.binding.subspan %b_{p}[%c0] : !stream.binding -> memref<{xr}x{b}{e}>{td}"
            for p, e in (("xq", "x32xi8"), ("dx", "xf32"), ("sx", "xf32"), ("sh", "xf32"))
            if p in _x_planes(q)
        ]
        base = "%r0"
    else:
        halves = "sh" in _x_planes(q)
        block = _quantize_block("%rx", "%r", f"{xr}x{b}x32xf32", f"{r}x{b}x32xi8", f"{r}x{b}xf32", halves)
        lines = [
            f"    %x = stream.binding.subspan %b_x[%c0] : !stream.binding -> memref<{xr}x{b}x32xf32>{td}",
            f"    %xq = memref.alloca() : memref<{r}x{b}x32xi8>",
            f"    %dx = memref.alloca() : memref<{r}x{b}xf32>",
            f"    %sx = memref.alloca() : memref<{r}x{b}xf32>",
            *([f"    %sh = memref.alloca() : memref<{r}x{b}xf32>"] if halves else []),
            "    %fzero = arith.constant 0.0 : f32",
            "    %fmax = arith.constant 127.0 : f32",
            "    scf.for %r = %c0 to %cR step %c1 {",
            "      scf.for %b = %c0 to %cB step %c1 {",
            "        %rx = arith.addi %r0, %r : index",
            block,
            "      }",
            "    }",
        ]
        base = "%c0"
    return "\n".join([*lines, *(f"    %xr{i} = arith.addi {base}, %c{i} : index" for i in range(r))])


def _x_operands(q: QuantType, r: int, k: int) -> str:
    return ", ".join(f"%x_{p}" for p in _x_planes(q)) if quantized_apart(r, k) else "%xb"


def _x_types(q: QuantType, r: int, k: int, xr: str, td: str) -> str:
    b = k // 32
    if not quantized_apart(r, k):
        return f"tensor<{xr}x{b}x32xf32>{td}"
    return ", ".join(f"tensor<{xr}x{b}{'x32xi8' if p == 'xq' else 'xf32'}>{td}" for p in _x_planes(q))


def _quantize_call(q: QuantType, name: str, r: int, k: int, tp: str) -> str:
    """The wrapper's dispatch that quantizes x (`%xb`) into `%x_xq, %x_dx, ..` before the kernel
    `name` where `quantized_apart` holds (tp: the padded row count of a prompt chunk, or empty)."""
    if not quantized_apart(r, k):
        return ""
    b, xr, td = k // 32, "?" if tp else str(r), f"{{{tp}}}" if tp else ""
    workload, args = (f"[{tp}]", f"%xb, {tp}") if tp else ("", "%xb")
    arg_types = f"tensor<?x{b}x32xf32>{{{tp}}}, index" if tp else f"tensor<{r}x{b}x32xf32>"
    return (
        f"  {_x_operands(q, r, k)} = flow.dispatch @{name}_xq_ex::@{name}_xq{workload}({args}) : ({arg_types}) -> "
        f"({_x_types(q, r, k, xr, td)})\n"
    )


def _quantize_executable(q: QuantType, name: str, r: int, k: int, prefill: bool) -> str:
    """The executable `_quantize_call` dispatches (mlir/dot8_quantize.mlir), one workgroup a row."""
    b = k // 32
    xr = "?" if prefill else str(r)
    halves = "sh" in _x_planes(q)
    block = _quantize_block("%row", "%row", f"{xr}x{b}x32xf32", f"{xr}x{b}x32xi8", f"{xr}x{b}xf32", halves)
    return template("dot8_quantize.mlir").substitute(
        NAME=f"{name}_xq", B=str(b), XR=xr, BLOCK=block,
        SH_BINDING=", %b_sh: !stream.binding" if halves else "",
        SH_SETUP=(f"    %sh = stream.binding.subspan %b_sh[%c0] : !stream.binding -> memref<{xr}x{b}xf32>"
                  + ("{%t}" if prefill else "")) if halves else "",
        WG_ARGS="%t: index" if prefill else "",
        WG_COUNT=("    %cz = arith.constant 0 : index\n    %n = arith.addi %t, %cz : index" if prefill
                  else f"    %n = arith.constant {r} : index"),
        T_ARG=", %t: index" if prefill else "", TD="{%t}" if prefill else "",
    )  # fmt: skip


def prefill_name(q: QuantType, n: int, k: int) -> str:
    return f"dot8_{q.name.lower()}_t_{n}x{k}"
