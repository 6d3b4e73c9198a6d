"""Dequantize one weight of a raw GGUF tensor at (row, column): the body of the embedding gather.

Owns: `gather_body`, the MLIR lines that compute `%v: f32`, the weight at (`%row`, `%k`) of a
tensor `%w` bound as its raw GGUF bytes (`QuantType.param_type`), for every type in
`kernels.QUANT_TYPES`. The byte layouts are the ones the `mlir/matmul_*.mlir` templates document;
here each weight is located with index arithmetic and read with `tensor.extract`.
Imports: zinc.compiler.bitops.
"""

from __future__ import annotations

from collections.abc import Callable

from zinc.compiler.bitops import bf16_to_f32, f16_to_f32, indented, kquant_scale, q5_value, u32_from_bytes


class _Body:
    """Accumulates body lines; index constants are declared once each."""

    def __init__(self, wt: str) -> None:
        self.wt = wt
        self.lines: list[str] = []
        self.consts: set[int] = set()
        self.text = ""

    def emit(self, *lines: str) -> None:
        self.lines.extend(lines)

    def flush(self, fragment: str = "") -> None:
        """Move the pending lines, then a ready-made (indented) fragment, into the text."""
        if self.lines:
            self.text += indented(self.lines) + "\n"
            self.lines = []
        if fragment:
            self.text += fragment + "\n"

    def idx(self, v: int) -> str:
        if v not in self.consts:
            self.consts.add(v)
            self.emit(f"%i{v} = arith.constant {v} : index")
        return f"%i{v}"

    def ix(self, out: str, op: str, a: str, c: int) -> str:
        """`out = a <op> c` on index values (op: divui, remui, muli, addi)."""
        self.emit(f"%{out} = arith.{op} {a}, {self.idx(c)} : index")
        return f"%{out}"

    def byte(self, out: str, block: str, off: str | int) -> str:
        """The i8 at byte `off` (an index value or a constant) of block `block` of row `%row`."""
        o = self.idx(off) if isinstance(off, int) else off
        self.emit(f"%{out} = tensor.extract %w[%row, {block}, {o}] : {self.wt}")
        return f"%{out}"

    def f16(self, out: str, block: str, off: int) -> str:
        lo, hi = self.byte(f"{out}lo", block, off), self.byte(f"{out}hi", block, off + 1)
        self.flush(f16_to_f32(lo, hi, f"%{out}"))
        return f"%{out}"

    def i8(self, out: str, v: str) -> str:
        self.emit(f"%{out} = arith.index_cast {v} : index to i8")
        return f"%{out}"

    def result(self) -> str:
        self.flush()
        return self.text.rstrip("\n")


def _plain(g: _Body, name: str) -> None:
    if name == "F32":
        g.emit(f"%v = tensor.extract %w[%row, %k] : {g.wt}")
        return
    lo, hi = g.byte("lo", "%k", 0), g.byte("hi", "%k", 1)
    g.flush((f16_to_f32 if name == "F16" else bf16_to_f32)(lo, hi, "%v"))


def _q8_0(g: _Body) -> None:
    b, j = g.ix("b", "divui", "%k", 32), g.ix("j", "remui", "%k", 32)
    d = g.f16("d", b, 0)
    q = g.byte("q", b, g.ix("jo", "addi", j, 2))
    g.emit(f"%qf = arith.sitofp {q} : i8 to f32", f"%v = arith.mulf %qf, {d} : f32")


def _nibble(g: _Body, byte: str, h: str) -> str:
    """i8 `%qn` = (byte >> 4h) & 15, for an index `h` in {0, 1}."""
    h8 = g.i8("h8", h)
    g.emit(
        "%c4 = arith.constant 4 : i8",
        f"%sh = arith.muli {h8}, %c4 : i8",
        f"%qs = arith.shrui {byte}, %sh : i8",
        "%c15 = arith.constant 15 : i8",
        "%qn = arith.andi %qs, %c15 : i8",
    )
    return "%qn"


def _q4(g: _Body, name: str) -> None:
    """Q4_0 (d, 16 nibble bytes; w = d (q - 8)) and Q4_1 (d, m, nibbles; w = d q + m)."""
    b, j = g.ix("b", "divui", "%k", 32), g.ix("j", "remui", "%k", 32)
    h, jj = g.ix("h", "divui", j, 16), g.ix("jj", "remui", j, 16)
    d = g.f16("d", b, 0)
    qn = _nibble(g, g.byte("byte", b, g.ix("jo", "addi", jj, 2 if name == "Q4_0" else 4)), h)
    if name == "Q4_0":
        g.emit(
            f"%qi = arith.extui {qn} : i8 to i32",
            "%c8 = arith.constant 8 : i32",
            "%qc = arith.subi %qi, %c8 : i32",
            "%qf = arith.sitofp %qc : i32 to f32",
            f"%v = arith.mulf %qf, {d} : f32",
        )
        return
    m = g.f16("m", b, 2)
    g.emit(
        f"%qf = arith.uitofp {qn} : i8 to f32",
        f"%wd = arith.mulf %qf, {d} : f32",
        f"%v = arith.addf %wd, {m} : f32",
    )


def _q5(g: _Body, name: str) -> None:
    """Q5_0 (d, qh, nibbles; w = d (q - 16)) and Q5_1 (d, m, qh, nibbles; w = d q + m)."""
    b, j = g.ix("b", "divui", "%k", 32), g.ix("j", "remui", "%k", 32)
    h, jj = g.ix("h", "divui", j, 16), g.ix("jj", "remui", j, 16)
    base = 2 if name == "Q5_0" else 4
    d = g.f16("d", b, 0)
    hb = (
        g.byte("b0", b, base),
        g.byte("b1", b, base + 1),
        g.byte("b2", b, base + 2),
        g.byte("b3", b, base + 3),
    )
    g.flush(u32_from_bytes(hb, "%qh"))
    q = g.byte("q", b, g.ix("jo", "addi", jj, base + 4))
    g.flush(q5_value(q, h, jj, "%qh", "%q5"))
    if name == "Q5_0":
        g.emit(
            "%c16 = arith.constant 16 : i32",
            "%qc = arith.subi %q5, %c16 : i32",
            "%qf = arith.sitofp %qc : i32 to f32",
            f"%v = arith.mulf %qf, {d} : f32",
        )
        return
    m = g.f16("m", b, 2)
    g.emit(
        "%qf = arith.uitofp %q5 : i32 to f32",
        f"%wd = arith.mulf %qf, {d} : f32",
        f"%v = arith.addf %wd, {m} : f32",
    )


def _q45_k(g: _Body, name: str) -> None:
    """Q4_K / Q5_K: sub-block s = j / 32 of 8, w = d sc[s] q - dmin m[s] (see matmul_q4_k.mlir)."""
    b, j = g.ix("b", "divui", "%k", 256), g.ix("j", "remui", "%k", 256)
    s, ln = g.ix("s", "divui", j, 32), g.ix("l", "remui", j, 32)
    c, h = g.ix("c", "divui", j, 64), g.ix("h", "remui", s, 2)
    u, i = g.ix("u", "divui", s, 4), g.ix("i", "remui", s, 4)
    g.f16("d", b, 0)
    g.f16("m", b, 2)
    g.byte("ka", b, g.ix("ia", "addi", i, 4))
    g.byte("kb", b, g.ix("ib", "addi", i, 8))
    g.byte("kc", b, g.ix("ic", "addi", i, 12))
    g.emit(f"%upper = arith.cmpi ne, {u}, {g.idx(0)} : index")
    g.flush(kquant_scale("%upper"))
    qbase = 16 if name == "Q4_K" else 48
    qo = g.ix("qo", "addi", g.ix("c32", "muli", c, 32), qbase)
    qn = _nibble(g, g.byte("byte", b, _add(g, "qoff", qo, ln)), h)
    if name == "Q5_K":
        qhb = g.byte("qhb", b, g.ix("qho", "addi", ln, 16))
        s8 = g.i8("s8", s)
        g.emit(
            f"%qhs = arith.shrui {qhb}, {s8} : i8",
            "%c1 = arith.constant 1 : i8",
            "%hb = arith.andi %qhs, %c1 : i8",
            "%h16 = arith.shli %hb, %c4 : i8",
            f"%q5 = arith.ori {qn}, %h16 : i8",
        )
        qn = "%q5"
    g.emit(
        f"%qf = arith.uitofp {qn} : i8 to f32",
        "%wd = arith.mulf %qf, %ds : f32",
        "%v = arith.subf %wd, %dm : f32",
    )


def _add(g: _Body, out: str, a: str, b: str) -> str:
    g.emit(f"%{out} = arith.addi {a}, {b} : index")
    return f"%{out}"


def _q6_k(g: _Body) -> None:
    """Q6_K: weight 128a + 32m + l (see matmul_q6_k.mlir)."""
    b, j = g.ix("b", "divui", "%k", 256), g.ix("j", "remui", "%k", 256)
    a, r = g.ix("a", "divui", j, 128), g.ix("r", "remui", j, 128)
    m, ln = g.ix("m", "divui", r, 32), g.ix("l", "remui", r, 32)
    mh, ml = g.ix("mh", "divui", m, 2), g.ix("ml", "remui", m, 2)
    d = g.f16("d", b, 208)
    qlo = _add(g, "qlo", _add(g, "qla", g.ix("a64", "muli", a, 64), g.ix("ml32", "muli", ml, 32)), ln)
    qho = _add(g, "qho", g.ix("a32", "addi", g.ix("a32m", "muli", a, 32), 128), ln)
    qlb, qhb = g.byte("qlb", b, qlo), g.byte("qhb", b, qho)
    scb = g.byte("scb", b, g.ix("sco", "addi", g.ix("j16", "divui", j, 16), 192))
    mh8, m8 = g.i8("mh8", mh), g.i8("m8", m)
    g.emit(
        "%c2 = arith.constant 2 : i8",
        "%c3 = arith.constant 3 : i8",
        "%c4 = arith.constant 4 : i8",
        "%c15 = arith.constant 15 : i8",
        "%c32 = arith.constant 32 : i8",
        f"%lsh = arith.muli {mh8}, %c4 : i8",
        f"%qls = arith.shrui {qlb}, %lsh : i8",
        "%qn = arith.andi %qls, %c15 : i8",
        f"%hsh = arith.muli {m8}, %c2 : i8",
        f"%qhs = arith.shrui {qhb}, %hsh : i8",
        "%qh2 = arith.andi %qhs, %c3 : i8",
        "%qh4 = arith.shli %qh2, %c4 : i8",
        "%q6 = arith.ori %qn, %qh4 : i8",
        "%qc = arith.subi %q6, %c32 : i8",
        "%qf = arith.sitofp %qc : i8 to f32",
        f"%scv = arith.sitofp {scb} : i8 to f32",
        f"%ds = arith.mulf {d}, %scv : f32",
        "%v = arith.mulf %qf, %ds : f32",
    )


_BODIES: dict[str, Callable[[_Body], None]] = {
    "F32": lambda g: _plain(g, "F32"),
    "F16": lambda g: _plain(g, "F16"),
    "BF16": lambda g: _plain(g, "BF16"),
    "Q8_0": _q8_0,
    "Q4_0": lambda g: _q4(g, "Q4_0"),
    "Q4_1": lambda g: _q4(g, "Q4_1"),
    "Q5_0": lambda g: _q5(g, "Q5_0"),
    "Q5_1": lambda g: _q5(g, "Q5_1"),
    "Q4_K": lambda g: _q45_k(g, "Q4_K"),
    "Q5_K": lambda g: _q45_k(g, "Q5_K"),
    "Q6_K": _q6_k,
}


def gather_body(name: str, wt: str) -> str:
    """MLIR lines computing `%v: f32`, the dequantized weight at (%row, %k) of `%w: wt`."""
    g = _Body(wt)
    _BODIES[name](g)
    return g.result()
