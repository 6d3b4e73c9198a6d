"""How the dp4 matmuls (zinc.compiler.dp4) read each GGUF type: the MLIR lines of one unit.

Owns: `UNITS` (per type: the 32-bit-word view of a weight row, and the units an invocation takes
in turn) and `unit_lines`, which turns a unit's words into `Sub`s: its 32-weight blocks, each as
(x block, 4-byte weight words paired with the quantized x words they multiply, scale, bias), so
that a block adds `scale * dx * sum(q_w q_x) + bias * sx` (dx, sx: the x block's scale and scaled
sum, mlir/dp4_quantize.mlir). Every quant is a signed byte by then: a nibble (0-15) as it is,
its offset (Q4_0's -8) or minimum (Q4_1's m, Q4_K's dmin * m) left to the bias.
  - Q4_0: a unit is two 18-byte blocks (9 words: f16 d, 16 bytes of nibbles, twice), the first
    block's quants 2 bytes into a word (joined from two words);
  - Q4_1: one 20-byte block (f16 d, f16 m, 16 bytes of nibbles);
  - Q8_0: two 34-byte blocks (17 words), as Q4_0 with 32 int8 quants;
  - Q4_K: a 64-weight quarter of a 144-byte super-block (f16 d, f16 dmin, 12 bytes of 6-bit
    scales and mins, 128 bytes of nibbles), so that K / 64 invocations share a row as for Q4_0;
    its two 32-blocks are the low and the high nibbles of the same 8 words; Q5_K (176 bytes) as
    Q4_K, with 32 bytes of fifth bits (bit j of byte l: weight l of 32-block j) OR-ed in;
  - Q5_0: two 22-byte blocks (11 words: f16 d, 32 fifth bits, 16 bytes of nibbles, twice), each
    nibble word OR-ed with its 4 fifth bits spread to bit 4 of each byte; w = d (q - 16);
  - Q6_K: a 64-weight quarter of a 210-byte super-block (128 bytes of low nibbles, 64 of 2-bit
    highs, 16 int8 scales, f16 d; two super-blocks are 105 words, the second 2 bytes into a
    word): x blocks c and c + 2 of one half, which share their bytes, each as two 16-weight
    Subs with their own scale; a 6-bit q becomes the signed byte q - 32 (bit 5 flipped, then
    sign-extended), so there is no bias.
Imports: zinc.compiler.bitops (f16 and K-quant scale decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

from zinc.compiler.bitops import f16_bits_to_f32, kquant_scale_words

IND = "          "  # the indent of a unit's lines in mlir/dp4_decode.mlir


@dataclass(frozen=True)
class Layout:
    """A weight row as `words_shape` i32 words per row; `per_unit` 32-blocks per unit."""

    block_weights: int  # weights per GGUF block
    block_words: int  # 32-bit words per `group` GGUF blocks
    group: int  # GGUF blocks viewed together (a whole number of words)
    per_unit: int  # 32-blocks per unit


UNITS = {
    "Q4_0": Layout(32, 9, 2, 2),
    "Q4_1": Layout(32, 5, 1, 1),
    "Q8_0": Layout(32, 17, 2, 2),
    "Q4_K": Layout(256, 36, 1, 2),
    "Q5_K": Layout(256, 44, 1, 2),
    "Q5_0": Layout(32, 11, 2, 2),
    "Q6_K": Layout(256, 105, 2, 2),
}


@dataclass(frozen=True)
class Sub:
    """Weights of a unit under one scale: a 32-block (Q6_K: half of one), and the x block they meet."""

    xblock: str  # SSA index of its x block in the row
    words: tuple[tuple[str, int], ...]  # (weight word: 4 signed bytes, the x word 0-7 it multiplies)
    scale: str  # f32
    bias: str | None  # f32, times the x block's sx


def words_shape(name: str, n: int, k: int) -> tuple[int, int, int]:
    lay = UNITS[name]
    return n, k // (lay.block_weights * lay.group), lay.block_words


def units(name: str, k: int) -> int:
    return k // (32 * UNITS[name].per_unit)


def half(word: str, high: bool, out: str) -> list[str]:
    """f32 `out` from the f16 in the low or high half of i32 `word` (bitops.f16_bits_to_f32:
    integer ops, exact for subnormal scales without an f32 denormal, which GPUs may flush)."""
    op = f"arith.shrui {word}, %c16i" if high else f"arith.andi {word}, %c65535i"
    return [f"{IND}{out}_bits = {op} : i32", *f16_bits_to_f32(f"{out}_bits", out, IND).split("\n")]


def joined(lo: str, hi: str, out: str) -> list[str]:
    """The word of bytes 2..5 of the pair (lo, hi): quants that start 2 bytes into a word."""
    return [f"{IND}{out}_a = arith.shrui {lo}, %c16i : i32", f"{IND}{out}_b = arith.shli {hi}, %c16i : i32",
            f"{IND}{out} = arith.ori {out}_a, {out}_b : i32"]  # fmt: skip


def nibbles(words: list[str], high: bool, tag: str) -> tuple[list[str], list[str]]:
    """The low (or high) nibble of each byte of `words`, as words of 4 bytes 0-15."""
    lines, outs = [], []
    for m, w in enumerate(words):
        src = w
        if high:
            lines.append(f"{IND}{tag}s{m} = arith.shrui {w}, %c4i : i32")
            src = f"{tag}s{m}"
        lines.append(f"{IND}{tag}{m} = arith.andi {src}, %nib : i32")
        outs.append(f"{tag}{m}")
    return lines, outs


def paired(words: list[str], first: int) -> tuple[tuple[str, int], ...]:
    """`words` with the x words they multiply: first, first + 1, ..."""
    return tuple((w, first + m) for m, w in enumerate(words))


def load(idx: list[str], out: str, wref: str) -> str:
    return f"{IND}{out} = memref.load %w[%row, {', '.join(idx)}] : {wref}"


def unit_lines(name: str, wref: str) -> tuple[list[str], list[Sub]]:
    """The lines that load and unpack unit %u of row %row, and its 32-blocks."""
    if name in ("Q4_K", "Q5_K"):
        return _k_quarter(wref, name == "Q5_K")
    if name == "Q5_0":
        return _q5_0(wref)
    if name == "Q6_K":
        return _q6_k(wref)
    lay = UNITS[name]
    lines = [load(["%u", f"%ci{i}"], f"%w{i}", wref) for i in range(lay.block_words)]
    lines.append(f"{IND}%blk0 = arith.muli %u, %c{lay.per_unit} : index")
    if name == "Q4_1":  # w = d q + m
        lines += half("%w0", False, "%d0") + half("%w0", True, "%mn0")
        lo, lo_w = nibbles(["%w1", "%w2", "%w3", "%w4"], False, "%ql")
        hi, hi_w = nibbles(["%w1", "%w2", "%w3", "%w4"], True, "%qh")
        pairs = paired(lo_w, 0) + paired(hi_w, 4)
        return lines + lo + hi, [Sub("%blk0", pairs, "%d0", "%mn0")]
    lines.append(f"{IND}%blk1 = arith.addi %blk0, %c1 : index")
    per = 4 if name == "Q4_0" else 8  # words of quants per block
    first = [f"%j{m}" for m in range(per)]
    for m in range(per):
        lines += joined(f"%w{m}", f"%w{m + 1}", f"%j{m}")
    second = [f"%w{i}" for i in range(per + 1, 2 * per + 1)]
    lines += half("%w0", False, "%d0") + half(f"%w{per}", True, "%d1")
    if name == "Q8_0":
        return lines, [Sub("%blk0", paired(first, 0), "%d0", None),
                       Sub("%blk1", paired(second, 0), "%d1", None)]  # fmt: skip
    subs = []  # Q4_0: w = d (q - 8), the -8 d a bias
    for b, (words, d) in enumerate(((first, "%d0"), (second, "%d1"))):
        lo, lo_w = nibbles(words, False, f"%ql{b}_")
        hi, hi_w = nibbles(words, True, f"%qh{b}_")
        lines += [*lo, *hi, f"{IND}%o{b} = arith.mulf {d}, %m8 : f32"]
        subs.append(Sub(f"%blk{b}", paired(lo_w, 0) + paired(hi_w, 4), d, f"%o{b}"))
    return lines, subs


def _k_quarter(wref: str, q5: bool) -> tuple[list[str], list[Sub]]:
    """Q4_K or Q5_K unit %u: quarter c = u % 4 of super-block u / 4: 32-blocks 2c (low nibbles) and
    2c + 1 (high nibbles) of 8 words, their 6-bit scale and min j = 2c, 2c + 1 from byte j % 4 of
    each row of 4 of the 12 scale bytes (bitops.kquant_scale_words, upper half: j >= 4). Q5_K: the fifth bit of weight l of block j is bit j of
    byte l of the 32 bytes (8 words) after the scales; its quants start 32 bytes later."""
    first_q = 12 if q5 else 4  # the word of the quants of quarter 0
    lines = [f"{IND}%sb = arith.divui %u, %c4 : index", f"{IND}%qc = arith.remui %u, %c4 : index",
             f"{IND}%q8 = arith.muli %qc, %c8 : index", f"{IND}%qbase = arith.addi %q8, %c{first_q} : index"]  # fmt: skip
    lines += [load(["%sb", f"%ci{i}"], f"%h{i}", wref) for i in range(4)]
    fifth = []
    if q5:
        for m in range(8):
            lines += [f"{IND}%x5i{m} = arith.addi %c4, %ci{m} : index", load(["%sb", f"%x5i{m}"], f"%x5w{m}", wref)]
            fifth.append(f"%x5w{m}")
    words = []
    for m in range(8):
        lines += [f"{IND}%qi{m} = arith.addi %qbase, %ci{m} : index", load(["%sb", f"%qi{m}"], f"%w{m}", wref)]
        words.append(f"%w{m}")
    lines += half("%h0", False, "%d") + half("%h0", True, "%dmin")
    lines += [f"{IND}%blk0 = arith.muli %u, %c2 : index", f"{IND}%blk1 = arith.addi %blk0, %c1 : index",
              f"{IND}%qci = arith.index_cast %qc : index to i32", f"{IND}%hi = arith.cmpi uge, %qci, %c2i : i32"]  # fmt: skip
    subs = []
    for b in range(2):  # j = 2c + b; i = j % 4 = (2c + b) & 3
        t = f"%k{b}"
        lines += [f"{IND}{t}j2 = arith.muli %qci, %c2i : i32", f"{IND}{t}j = arith.addi {t}j2, %c{b}i : i32",
                  f"{IND}{t}i = arith.andi {t}j, %c3i : i32", f"{IND}{t}sh = arith.muli {t}i, %c8i : i32"]  # fmt: skip
        for src, byte in (("%h1", "a"), ("%h2", "b"), ("%h3", "e")):  # byte i of s[0:4], s[4:8], s[8:12]
            lines += [f"{IND}{t}{byte}s = arith.shrui {src}, {t}sh : i32", f"{IND}{t}{byte} = arith.andi {t}{byte}s, %c255i : i32"]
        scale = kquant_scale_words((f"{t}a", f"{t}b", f"{t}e"), "%hi", ("%d", "%dmin"), (f"{t}scale", f"{t}dm"), f"{t}ks", IND)
        lines += [*scale.split("\n"), f"{IND}{t}bias = arith.negf {t}dm : f32"]
        nib, outs = nibbles(words, b == 1, f"%q{b}_")
        lines += nib
        if q5:  # bit j of each byte to bit 4: OR-ed into the nibbles
            merged = []
            for m, (w, hw) in enumerate(zip(outs, fifth, strict=True)):
                v = f"{t}f{m}"
                lines += [f"{IND}{v}s = arith.shrui {hw}, {t}j : i32", f"{IND}{v}a = arith.andi {v}s, %m01 : i32",
                          f"{IND}{v}b = arith.shli {v}a, %c4i : i32", f"{IND}{v} = arith.ori {w}, {v}b : i32"]  # fmt: skip
                merged.append(v)
            outs = merged
        subs.append(Sub(f"%blk{b}", paired(outs, 0), f"{t}scale", f"{t}bias"))
    return lines, subs


def spread(bits: str, out: str) -> list[str]:
    """The 4 low bits of i32 `bits` moved to bit 4 of bytes 0-3 (Q5_0's fifth bits)."""
    lines = []
    for e, shift in enumerate((4, 11, 18, 25)):
        lines += [f"{IND}{out}m{e} = arith.andi {bits}, %c{1 << e}i : i32", f"{IND}{out}s{e} = arith.shli {out}m{e}, %c{shift}i : i32"]
    return [*lines, f"{IND}{out}o1 = arith.ori {out}s0, {out}s1 : i32", f"{IND}{out}o2 = arith.ori {out}s2, {out}s3 : i32",
            f"{IND}{out} = arith.ori {out}o1, {out}o2 : i32"]  # fmt: skip


def _q5_0(wref: str) -> tuple[list[str], list[Sub]]:
    """Unit %u: two blocks; block 0 is d in word 0's low half, its fifth bits in bytes 2-5 and
    quants in bytes 6-21 (joined words), block 1's d in word 5's high half, then word 6 its fifth
    bits and words 7-10 its quants."""
    lines = [load(["%u", f"%ci{i}"], f"%w{i}", wref) for i in range(11)]
    lines += [f"{IND}%blk0 = arith.muli %u, %c2 : index", f"{IND}%blk1 = arith.addi %blk0, %c1 : index"]
    lines += joined("%w0", "%w1", "%qh0")
    first = []
    for m in range(4):
        lines += joined(f"%w{m + 1}", f"%w{m + 2}", f"%j{m}")
        first.append(f"%j{m}")
    lines += half("%w0", False, "%d0") + half("%w5", True, "%d1")
    subs = []
    for b, (words, qh, d) in enumerate(((first, "%qh0", "%d0"), (["%w7", "%w8", "%w9", "%w10"], "%w6", "%d1"))):
        lo, lo_w = nibbles(words, False, f"%ql{b}_")
        hi, hi_w = nibbles(words, True, f"%qh{b}_")
        lines += [*lo, *hi, f"{IND}%o{b} = arith.mulf {d}, %m16 : f32"]
        merged = []
        for m in range(8):  # word m's elements: 4m.. (low nibbles, m < 4), 16 + 4(m - 4).. (high)
            src = lo_w[m] if m < 4 else hi_w[m - 4]
            t = f"%f{b}_{m}"
            lines += [f"{IND}{t}b = arith.shrui {qh}, %c{4 * m}i : i32", *spread(f"{t}b", f"{t}sp"),
                      f"{IND}{t} = arith.ori {src}, {t}sp : i32"]  # fmt: skip
            merged.append(t)
        subs.append(Sub(f"%blk{b}", paired(merged, 0), d, f"%o{b}"))
    return lines, subs


def _q6_k(wref: str) -> tuple[list[str], list[Sub]]:
    """Unit %u: quarter q = u % 4 of super-block sb = u / 4 (half h = q / 2, pair p = q % 2): x
    blocks c = p and p + 2 of the half, from 8 words of low nibbles at byte 64h + 32p (c >= 2: the
    high nibbles) and 8 words of highs at 128 + 32h (bits 2c, 2c + 1 of each byte), scales
    8h + 2c and 8h + 2c + 1 for its two halves. An odd super-block starts 2 bytes into a word:
    each of its words is joined from two."""
    lines = [f"{IND}%sb = arith.divui %u, %c4 : index", f"{IND}%qq = arith.remui %u, %c4 : index",
             f"{IND}%pair = arith.divui %sb, %c2 : index", f"{IND}%odd = arith.remui %sb, %c2 : index",
             f"{IND}%hh = arith.divui %qq, %c2 : index", f"{IND}%pp = arith.remui %qq, %c2 : index",
             f"{IND}%base = arith.muli %odd, %c52 : index", f"{IND}%oddi = arith.index_cast %odd : index to i32",
             f"{IND}%isodd = arith.cmpi ne, %oddi, %c0i : i32"]  # fmt: skip

    def word(byte_word: str, out: str) -> list[str]:
        """Word `byte_word` (an index SSA, in words from the super-block's start) of this super-block."""
        return [f"{IND}{out}_i = arith.addi %base, {byte_word} : index", f"{IND}{out}_n = arith.addi {out}_i, %c1 : index",
                load(["%pair", f"{out}_i"], f"{out}_a", wref), load(["%pair", f"{out}_n"], f"{out}_b", wref),
                *joined(f"{out}_a", f"{out}_b", f"{out}_j"),
                f"{IND}{out} = arith.select %isodd, {out}_j, {out}_a : i32"]  # fmt: skip

    lines += [f"{IND}%ql16 = arith.muli %hh, %c16 : index", f"{IND}%ql8 = arith.muli %pp, %c8 : index",
              f"{IND}%qlw = arith.addi %ql16, %ql8 : index", f"{IND}%qh8 = arith.muli %hh, %c8 : index",
              f"{IND}%qhw = arith.addi %qh8, %c32 : index"]  # fmt: skip
    ql, qh = [], []
    for m in range(8):
        lines += [f"{IND}%lw{m}i = arith.addi %qlw, %ci{m} : index", *word(f"%lw{m}i", f"%lw{m}"),
                  f"{IND}%hw{m}i = arith.addi %qhw, %ci{m} : index", *word(f"%hw{m}i", f"%hw{m}")]  # fmt: skip
        ql.append(f"%lw{m}")
        qh.append(f"%hw{m}")
    # d: bytes 208-209, the low half of word 52 (an odd super-block's: the high half of word 104)
    lines += [f"{IND}%dwi = arith.addi %base, %c52 : index", load(["%pair", "%dwi"], "%dwa", wref),
              f"{IND}%dwh = arith.shrui %dwa, %c16i : i32", f"{IND}%dw = arith.select %isodd, %dwh, %dwa : i32"]
    lines += half("%dw", False, "%d")
    lines += [f"{IND}%hh2 = arith.muli %hh, %c2 : index", f"{IND}%sw0 = arith.addi %hh2, %c48 : index",
              f"{IND}%sw1 = arith.addi %sw0, %c1 : index",
              *word("%sw0", "%scw0"), *word("%sw1", "%scw1")]  # scales 8h..8h+3 and 8h+4..8h+7
    lines += [f"{IND}%sb8 = arith.muli %sb, %c8 : index", f"{IND}%hh4 = arith.muli %hh, %c4 : index",
              f"{IND}%xb0 = arith.addi %sb8, %hh4 : index", f"{IND}%ppi = arith.index_cast %pp : index to i32"]  # fmt: skip
    subs = []
    for cc in range(2):  # c = p + 2 cc
        t = f"%c{cc}_"
        lines += [f"{IND}{t}xb = arith.addi %xb0, %pp : index"] if cc == 0 else [
            f"{IND}{t}xp = arith.addi %xb0, %pp : index", f"{IND}{t}xb = arith.addi {t}xp, %c2 : index"]
        lines += [f"{IND}{t}c = arith.addi %ppi, %c{2 * cc}i : i32", f"{IND}{t}hs = arith.muli {t}c, %c2i : i32"]
        words = []
        for m in range(8):
            v = f"{t}q{m}"
            lo = [f"{IND}{v}l = arith.andi {ql[m]}, %nib : i32"] if cc == 0 else [
                f"{IND}{v}ls = arith.shrui {ql[m]}, %c4i : i32", f"{IND}{v}l = arith.andi {v}ls, %nib : i32"]
            lines += [*lo, f"{IND}{v}hs = arith.shrui {qh[m]}, {t}hs : i32", f"{IND}{v}h3 = arith.andi {v}hs, %m03 : i32",
                      f"{IND}{v}h = arith.shli {v}h3, %c4i : i32", f"{IND}{v}u = arith.ori {v}l, {v}h : i32",
                      f"{IND}{v}f = arith.xori {v}u, %m20 : i32", f"{IND}{v}s5 = arith.andi {v}f, %m20 : i32",
                      f"{IND}{v}s6 = arith.shli {v}s5, %c1i : i32", f"{IND}{v}s7 = arith.shli {v}s5, %c2i : i32",
                      f"{IND}{v}o = arith.ori {v}f, {v}s6 : i32", f"{IND}{v} = arith.ori {v}o, {v}s7 : i32"]  # fmt: skip
            words.append(v)
        for hf in range(2):  # the scale of weights 16 hf.. of block c: byte 2c + hf of the half's 8
            sc = f"{t}s{hf}"
            src = f"%scw{cc}"  # c = p + 2cc: bytes 2p + hf of scale word cc
            lines += [f"{IND}{sc}b = arith.muli %ppi, %c16i : i32", f"{IND}{sc}o = arith.addi {sc}b, %c{8 * hf}i : i32",
                      f"{IND}{sc}l = arith.subi %c24i, {sc}o : i32", f"{IND}{sc}u = arith.shli {src}, {sc}l : i32",
                      f"{IND}{sc}i = arith.shrsi {sc}u, %c24i : i32", f"{IND}{sc}f = arith.sitofp {sc}i : i32 to f32",
                      f"{IND}{sc} = arith.mulf %d, {sc}f : f32"]  # fmt: skip
            subs.append(Sub(f"{t}xb", paired(words[4 * hf : 4 * hf + 4], 4 * hf), sc, None))
    return lines, subs
