"""The linalg quantized matmuls of every Vulkan target: two reduction dims.

Owns: `render` and `FORMS`, the forms of the nibble-packed types (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
Q5_K, Q6_K) that every Vulkan target compiles (the CPU's fallback keeps mlir/matmul_*.mlir's), and
`render_rows` (BLOCK_TYPES, ROW_STEP), the generic target's form over several rows.

IREE 3.13 compiles a matvec on the named GPU targets (ampere, rdna3, ...) with its
SubgroupReduce pipeline, and that pipeline maps invocations to the wrong elements when a
reduction has three dims or more: it drops the
4-wide vector factor from the outermost dim's index (a Q4_0 row of 256 weights, looped as
(block, half, 16), read block tid / 32 where tid / 8 holds it), so the templates' forms, which
loop over (block, half, j) or more, computed wrong rows (tests/kernels/test_subgroup_matmul.py,
on lavapipe with a target that declares its subgroups). Each form here loops over (block, l) only:
l runs over L consecutive bytes or weights, and the body takes every weight those bytes hold,
each packed field read through a slice of its own (the low and high nibbles of a byte in one
step, every sub-block of a K-quant super-block unrolled), so every map stays a projection and
no value needs a loop index but Q5's bit number, an i32 iota over l. The weights are the GGUF
blocks as they are; the products are those of the templates in another order.
The generic target takes these forms too, for speed: a body decodes a block's f16 scales once
per byte or more (for a K-quant, once for every weight its bytes hold at l), where the
templates' decode them once per weight.
`render_rows` is the generic target's form of a matmul over several rows (a prompt chunk, a
decode batch) for the 32-weight block types: each step takes a byte of each of 16 / ROW_STEP
groups of a block's quants (8 weights) and decodes its scales once for them. That target gives
each invocation a whole (token, row) pair, so its time is the body's arithmetic, most of it the
scales' decoding (lavapipe: half the time of `render`'s form over 20 rows, the same over one). A
whole block a step is a little faster still, but its 52 operands make a model's compile slower.
Imports: zinc.compiler.bitops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from zinc.compiler.bitops import f16_to_f32, indented, kquant_scale_words, u32_from_bytes


@dataclass(frozen=True)
class Form:
    """A type's loop: `inner` = L, `w` the GGUF byte slices (SSA name, byte offset, length: L for
    one byte per l, 1 for one byte per block), `x_groups` the L-wide groups of x a block spans,
    `iota` whether the body reads l."""

    inner: int
    w: tuple[tuple[str, int, int], ...]
    x_groups: int
    iota: bool = False


def _bytes(prefix: str, start: int, n: int) -> tuple[tuple[str, int, int], ...]:
    return tuple((f"{prefix}{i}", start + i, 1) for i in range(n))


FORMS: dict[str, Form] = {
    "Q4_0": Form(16, (("d0", 0, 1), ("d1", 1, 1), ("q", 2, 16)), 2),
    "Q4_1": Form(16, (("d0", 0, 1), ("d1", 1, 1), ("m0", 2, 1), ("m1", 3, 1), ("q", 4, 16)), 2),
    "Q5_0": Form(16, (("d0", 0, 1), ("d1", 1, 1), *_bytes("h", 2, 4), ("q", 6, 16)), 2, iota=True),
    "Q5_1": Form(16, (("d0", 0, 1), ("d1", 1, 1), ("m0", 2, 1), ("m1", 3, 1), *_bytes("h", 4, 4), ("q", 8, 16)), 2, iota=True),
    "Q4_K": Form(32, (("d0", 0, 1), ("d1", 1, 1), ("m0", 2, 1), ("m1", 3, 1), *_bytes("k", 4, 12),
                      *((f"q{p}", 16 + 32 * p, 32) for p in range(4))), 8),
    "Q5_K": Form(32, (("d0", 0, 1), ("d1", 1, 1), ("m0", 2, 1), ("m1", 3, 1), *_bytes("k", 4, 12), ("qh", 16, 32),
                      *((f"q{p}", 48 + 32 * p, 32) for p in range(4))), 8),
    # Q6_K: ql byte 64a + 32c + 16g + l, qh byte 32a + 16g + l (a, c, g < 2), 16 scales, d
    "Q6_K": Form(16, (*((f"ql{a}{c}{g}", 64 * a + 32 * c + 16 * g, 16) for a in (0, 1) for c in (0, 1) for g in (0, 1)),
                      *((f"qh{a}{g}", 128 + 32 * a + 16 * g, 16) for a in (0, 1) for g in (0, 1)),
                      *_bytes("s", 192, 16), ("d0", 208, 1), ("d1", 209, 1)), 16),
}  # fmt: skip


@dataclass
class _Body:
    """SSA lines of a generic body with fresh names and shared constants."""

    lines: list[str] = field(default_factory=list)
    consts: dict[tuple[int, str], str] = field(default_factory=dict)
    ids: count[int] = field(default_factory=count)

    def op(self, text: str, ty: str = "i32") -> str:
        """`text` as a new value; `ty` its type suffix ("": the text has its own)."""
        name = f"%v{next(self.ids)}"
        self.lines.append(f"{name} = {text} : {ty}" if ty else f"{name} = {text}")
        return name

    def const(self, value: int, ty: str = "i32") -> str:
        if (value, ty) not in self.consts:
            self.consts[(value, ty)] = self.op(f"arith.constant {value}", ty)
        return self.consts[(value, ty)]

    def byte(self, arg: str) -> str:
        """An i8 argument widened to i32 0-255 (i8 shifts are unreliable on Vulkan: bitops)."""
        return self.op(f"arith.extui %a_{arg} : i8 to i32", "")

    def f16(self, lo: str, hi: str) -> str:
        out = f"%f{next(self.ids)}"
        self.lines.append(f16_to_f32(f"%a_{lo}", f"%a_{hi}", out, indent=""))
        return out

    def f32(self, v: str, signed: bool = False) -> str:
        return self.op(f"arith.{'sitofp' if signed else 'uitofp'} {v} : i32 to f32", "")

    def fma(self, acc: str | None, a: str, b: str) -> str:
        p = self.op(f"arith.mulf {a}, {b}", "f32")
        return p if acc is None else self.op(f"arith.addf {acc}, {p}", "f32")


def _nibbles(b: _Body, arg: str) -> tuple[str, str]:
    q = b.byte(arg)
    return b.op(f"arith.andi {q}, {b.const(15)}"), b.op(f"arith.shrui {q}, {b.const(4)}")


def _bit4(b: _Body, v: str, qh: str, shift: str) -> str:
    """v | ((qh >> shift) & 1) << 4."""
    bit = b.op(f"arith.andi {b.op(f'arith.shrui {qh}, {shift}')}, {b.const(1)}")
    return b.op(f"arith.ori {v}, {b.op(f'arith.shli {bit}, {b.const(4)}')}")


def _block32(b: _Body, qname: str) -> str:
    """Q4_0, Q4_1, Q5_0, Q5_1: weights j (low nibbles, x0) and 16 + j (high nibbles, x1)."""
    lo, hi = _nibbles(b, "q")
    if qname in ("Q5_0", "Q5_1"):
        qh = _u32(b, ("%a_h0", "%a_h1", "%a_h2", "%a_h3"))
        lo = _bit4(b, lo, qh, "%j")
        hi = _bit4(b, hi, qh, b.op(f"arith.addi %j, {b.const(16)}"))
    d = b.f16("d0", "d1")
    if qname in ("Q4_0", "Q5_0"):
        off = b.const(8 if qname == "Q4_0" else 16)
        lo, hi = (b.f32(b.op(f"arith.subi {v}, {off}"), signed=True) for v in (lo, hi))
        return b.op(f"arith.mulf {b.fma(b.fma(None, lo, '%x0'), hi, '%x1')}, {d}", "f32")
    m = b.f16("m0", "m1")
    dot = b.fma(b.fma(None, b.f32(lo), "%x0"), b.f32(hi), "%x1")
    xs = b.op("arith.addf %x0, %x1", "f32")
    return b.fma(b.op(f"arith.mulf {dot}, {d}", "f32"), m, xs)


def _u32(b: _Body, args: tuple[str, str, str, str]) -> str:
    out = f"%u{next(b.ids)}"
    b.lines.append(u32_from_bytes(args, out, indent=""))
    return out


def _kquant(b: _Body, qname: str) -> str:
    """Q4_K, Q5_K: sub-block s = 2p + h is nibble h of the 32 bytes q{p}; term d*sc*q - dmin*m."""
    d, dmin = b.f16("d0", "d1"), b.f16("m0", "m1")
    k = [b.byte(f"k{i}") for i in range(12)]
    upper = {False: b.op("arith.constant false", ""), True: b.op("arith.constant true", "")}
    qh = b.byte("qh") if qname == "Q5_K" else ""
    total: str | None = None
    for p in range(4):
        for h, v in enumerate(_nibbles(b, f"q{p}")):
            s = 2 * p + h
            if qname == "Q5_K":
                v = _bit4(b, v, qh, b.const(s))
            ds, dm = f"%ds{s}", f"%dm{s}"
            i = s % 4
            b.lines.append(
                kquant_scale_words(
                    (k[i], k[4 + i], k[8 + i]), upper[s >= 4], (d, dmin), (ds, dm), f"%ks{s}", ""
                )
            )
            w = b.op(f"arith.subf {b.op(f'arith.mulf {ds}, {b.f32(v)}', 'f32')}, {dm}", "f32")
            total = b.fma(total, w, f"%x{s}")
    assert total is not None
    return total


def _q6_k(b: _Body) -> str:
    """Q6_K: weight 128a + 32m + 16g + l is nibble m // 2 of ql{a}{m % 2}{g} with bits 2m, 2m + 1
    of qh{a}{g} above it; its scale and x group are both 8a + 2m + g."""
    total: str | None = None
    for a in (0, 1):
        for g in (0, 1):
            qh = b.byte(f"qh{a}{g}")
            nib = {c: _nibbles(b, f"ql{a}{c}{g}") for c in (0, 1)}
            for m in range(4):
                hi2 = b.op(f"arith.andi {b.op(f'arith.shrui {qh}, {b.const(2 * m)}')}, {b.const(3)}")
                q = b.op(f"arith.ori {nib[m % 2][m // 2]}, {b.op(f'arith.shli {hi2}, {b.const(4)}')}")
                idx = 8 * a + 2 * m + g
                sc = b.op(f"arith.extsi %a_s{idx} : i8 to i32", "")
                qs = b.op(f"arith.muli {b.op(f'arith.subi {q}, {b.const(32)}')}, {sc}")
                total = b.fma(total, b.f32(qs, signed=True), f"%x{idx}")
    assert total is not None
    return b.op(f"arith.mulf {total}, {b.f16('d0', 'd1')}", "f32")


def _operands(
    form: Form, n: int, blocks: int, block_bytes: int, k: int, dims: dict[str, str]
) -> tuple[list[str], list[tuple[str, str, str, str]]]:
    """The slices of W and x (and the iota) the generic reads: their lines, and per operand (SSA,
    type, map result, the body's block argument)."""
    t, tv = dims["T"], dims["TV"]
    inner, groups = form.inner, form.x_groups
    wt, xt, xg = (
        f"tensor<{n}x{blocks}x{block_bytes}xi8>",
        f"tensor<{t}x{k}xf32>",
        f"tensor<{t}x{blocks}x{groups}x{inner}xf32>",
    )
    lines: list[str] = []
    ins: list[tuple[str, str, str, str]] = []
    for arg, offset, size in form.w:
        ty = f"tensor<{n}x{blocks}xi8>" if size == 1 else f"tensor<{n}x{blocks}x{size}xi8>"
        lines.append(
            f"  %w_{arg} = tensor.extract_slice %w[0, 0, {offset}] [{n}, {blocks}, {size}] [1, 1, 1] : {wt} to {ty}"
        )
        ins.append((f"%w_{arg}", ty, "n, b" if size == 1 else "n, b, l", f"%a_{arg}: i8"))
    lines.append(
        f"  %xg = tensor.expand_shape %x [[0], [1, 2, 3]] output_shape [{tv}, {blocks}, {groups}, {inner}] : {xt} into {xg}"
    )
    for g in range(groups):
        ty = f"tensor<{t}x{blocks}x{inner}xf32>"
        lines.append(
            f"  %x_{g} = tensor.extract_slice %xg[0, 0, {g}, 0] [{tv}, {blocks}, 1, {inner}] [1, 1, 1, 1] : {xg} to {ty}"
        )
        ins.append((f"%x_{g}", ty, "t, b, l", f"%x{g}: f32"))
    if form.iota:
        lines.append(
            f"  %iota = arith.constant dense<[{', '.join(map(str, range(inner)))}]> : tensor<{inner}xi32>"
        )
        ins.append(("%iota", f"tensor<{inner}xi32>", "l", "%j: i32"))
    return lines, ins


def render(qname: str, block: int, block_bytes: int, name: str, n: int, k: int, dims: dict[str, str]) -> str:
    """The private func `name`: y[T, n] = x[T, k] @ W[n, k]^T, W bound as [n, k / block,
    block_bytes] i8; `dims` the token dimension's placeholders (kernels.t_dims)."""
    form = FORMS[qname]
    lines, ins = _operands(form, n, k // block, block_bytes, k, dims)
    b = _Body()
    if qname == "Q6_K":
        total = _q6_k(b)
    elif qname in ("Q4_K", "Q5_K"):
        total = _kquant(b, qname)
    else:
        total = _block32(b, qname)
    comment = f"{qname} in two reduction dims (zinc.compiler.subgroup_matmul): loop (t, n, b, l), l < {form.inner}."
    return _func(comment, name, f"tensor<{n}x{k // block}x{block_bytes}xi8>", dims, n, k, lines, ins, b, total)


def _func(
    comment: str, name: str, wt: str, dims: dict[str, str], n: int, k: int,
    lines: list[str], ins: list[tuple[str, str, str, str]], b: _Body, total: str,
) -> str:  # fmt: skip
    """The private func `name`: (W of type `wt`, x [T, k]) -> y [T, n], `lines` slicing them
    into the operands `ins` of one linalg.generic over (t, n, b, l) that adds the body `b`'s
    `total` into y."""
    t, dyn = dims["T"], dims["DYN"]
    xt, yt = f"tensor<{t}x{k}xf32>", f"tensor<{t}x{n}xf32>"
    maps = ", ".join(f"affine_map<(t, n, b, l) -> ({r})>" for _, _, r, _ in ins)
    out = [
        f"// {comment}",
        f"func.func private @{name}(%w: {wt}, %x: {xt}) -> {yt} {{",
        "  %c0 = arith.constant 0 : index",
        f"  %T = tensor.dim %x, %c0 : {xt}",
        *lines,
        "  %zero = arith.constant 0.0 : f32",
        f"  %e = tensor.empty({dyn}) : {yt}",
        f"  %acc = linalg.fill ins(%zero : f32) outs(%e : {yt}) -> {yt}",
        f"  %y = linalg.generic {{indexing_maps = [{maps}, affine_map<(t, n, b, l) -> (t, n)>],",
        '      iterator_types = ["parallel", "parallel", "reduction", "reduction"]}',
        f"      ins({', '.join(op[0] for op in ins)} : {', '.join(op[1] for op in ins)})",
        f"      outs(%acc : {yt}) {{",
        f"    ^bb0({', '.join(op[3] for op in ins)}, %a: f32):",
        indented("\n".join(b.lines).splitlines()),
        f"      %s = arith.addf %a, {total} : f32",
        "      linalg.yield %s : f32",
        f"  }} -> {yt}",
        f"  return %y : {yt}",
        "}",
    ]
    return "\n".join(out) + "\n"


# the 32-weight block types' fields: (scale bytes, min bytes or None, fifth-bit bytes or None, quants)
_BLOCK32 = {
    "Q4_0": (0, None, None, 2),
    "Q4_1": (0, 2, None, 4),
    "Q5_0": (0, None, 2, 6),
    "Q5_1": (0, 2, 4, 8),
}
BLOCK_TYPES = tuple(_BLOCK32)
ROW_STEP = 4  # quant bytes per group in `render_rows`: 16 / ROW_STEP groups, a step l < ROW_STEP


def _rows_body(b: _Body, qname: str) -> str:
    """One step l of a 32-block: quant byte ROW_STEP g + l of each group g holds weights
    ROW_STEP g + l (low nibble, x group g) and 16 + ROW_STEP g + l (high nibble, x group
    16 / ROW_STEP + g), with qh's bits of those numbers as the fifth for Q5; the sum times d, plus
    m times the x's (Q4_1, Q5_1)."""
    _, m_at, h_at, _ = _BLOCK32[qname]
    groups = 16 // ROW_STEP
    qh = _u32(b, ("%a_h0", "%a_h1", "%a_h2", "%a_h3")) if h_at is not None else None
    off = {"Q4_0": 8, "Q5_0": 16}.get(qname)
    dot: str | None = None
    xsum: str | None = None
    for g in range(groups):
        lo, hi = _nibbles(b, f"q{g}")
        x_lo, x_hi = f"%x{g}", f"%x{groups + g}"
        if qh is not None:
            bit = b.op(f"arith.addi %j, {b.const(ROW_STEP * g)}")
            lo = _bit4(b, lo, qh, bit)
            hi = _bit4(b, hi, qh, b.op(f"arith.addi {bit}, {b.const(16)}"))
        if off is not None:
            lo, hi = (b.f32(b.op(f"arith.subi {v}, {b.const(off)}"), signed=True) for v in (lo, hi))
        else:
            lo, hi = b.f32(lo), b.f32(hi)
            pair = b.op(f"arith.addf {x_lo}, {x_hi}", "f32")
            xsum = pair if xsum is None else b.op(f"arith.addf {xsum}, {pair}", "f32")
        dot = b.fma(b.fma(dot, lo, x_lo), hi, x_hi)
    assert dot is not None
    total = b.op(f"arith.mulf {dot}, {b.f16('d0', 'd1')}", "f32")
    if m_at is None:
        return total
    assert xsum is not None
    return b.fma(total, b.f16("m0", "m1"), xsum)


def render_rows(qname: str, block_bytes: int, name: str, n: int, k: int, dims: dict[str, str]) -> str:
    """`render`'s func for a 32-weight block type (BLOCK_TYPES) over several rows, looped over
    (t, n, block, l), l < ROW_STEP: the quants as 16 / ROW_STEP slices of ROW_STEP bytes, x as
    32 / ROW_STEP slices of [T, k / 32, ROW_STEP], so a step takes 2 * 16 / ROW_STEP weights and
    decodes the scales once for them (`render`'s forms: once per 2)."""
    _, m_at, h_at, q_at = _BLOCK32[qname]
    t, tv = dims["T"], dims["TV"]
    blocks, step, groups = k // 32, ROW_STEP, 16 // ROW_STEP
    wt, xt = f"tensor<{n}x{blocks}x{block_bytes}xi8>", f"tensor<{t}x{k}xf32>"
    fields = [("d0", 0, 1), ("d1", 1, 1)]
    fields += [("m0", m_at, 1), ("m1", m_at + 1, 1)] if m_at is not None else []
    fields += [(f"h{i}", h_at + i, 1) for i in range(4)] if h_at is not None else []
    fields += [(f"q{g}", q_at + step * g, step) for g in range(groups)]
    lines, ins = [], []
    for arg, at, size in fields:
        ty = f"tensor<{n}x{blocks}xi8>" if size == 1 else f"tensor<{n}x{blocks}x{size}xi8>"
        lines.append(f"  %w_{arg} = tensor.extract_slice %w[0, 0, {at}] [{n}, {blocks}, {size}] [1, 1, 1] : {wt} to {ty}")
        ins.append((f"%w_{arg}", ty, "n, b" if size == 1 else "n, b, l", f"%a_{arg}: i8"))
    xg, xs = f"tensor<{t}x{blocks}x{2 * groups}x{step}xf32>", f"tensor<{t}x{blocks}x{step}xf32>"
    lines.append(
        f"  %xg = tensor.expand_shape %x [[0], [1, 2, 3]] output_shape [{tv}, {blocks}, {2 * groups}, {step}] "
        f": {xt} into {xg}"
    )
    for j in range(2 * groups):
        lines.append(f"  %x_{j} = tensor.extract_slice %xg[0, 0, {j}, 0] [{tv}, {blocks}, 1, {step}] [1, 1, 1, 1] : {xg} to {xs}")
        ins.append((f"%x_{j}", xs, "t, b, l", f"%x{j}: f32"))
    if h_at is not None:
        lines.append(f"  %iota = arith.constant dense<[{', '.join(map(str, range(step)))}]> : tensor<{step}xi32>")
        ins.append(("%iota", f"tensor<{step}xi32>", "l", "%j: i32"))
    b = _Body()
    total = _rows_body(b, qname)
    comment = f"{qname} over rows (zinc.compiler.subgroup_matmul.render_rows): loop (t, n, b, l), l < {step}."
    return _func(comment, name, wt, dims, n, k, lines, ins, b, total)
