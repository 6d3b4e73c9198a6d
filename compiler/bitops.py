"""MLIR fragments that decode packed GGUF fields with integer ops only.

Owns: the text snippets that kernels and gathers splice into `linalg.generic` bodies: f16 and bf16
values assembled from i8 bytes (`f16_to_f32`, `f16_bits_to_f32`, `bf16_to_f32`), f32 rounded to
f16 bits (`f32_to_f16_bits`: the Vulkan KV slab's f16 values, two to an i32 word) and the 6-bit
sub-block scale/min unpacking of the K-quants (`kquant_scale`, `kquant_scale_words`). Everything is built from i8 bytes
or i32 words with extui/shli/ori/andi, never from an f16 or i16 bitcast: IREE's default Vulkan
target emulates f16 and misreads i16 tensor elements, so these integer forms are the ones correct
everywhere.
Imports: nothing from zinc (a leaf).
"""

from __future__ import annotations

INDENT = "      "


def indented(lines: list[str], indent: str = INDENT) -> str:
    return "\n".join(indent + ln for ln in lines)


def f16_to_f32(lo: str, hi: str, out: str, indent: str = INDENT) -> str:
    """MLIR lines decoding an f16 given as two i8 SSA values (little-endian) into f32 `%out`:
    bits = lo | hi << 8, then `f16_bits_to_f32`."""
    p = out.lstrip("%")
    lines = [
        f"%{p}_l = arith.extui {lo} : i8 to i32",
        f"%{p}_h = arith.extui {hi} : i8 to i32",
        f"%{p}_c8 = arith.constant 8 : i32",
        f"%{p}_hs = arith.shli %{p}_h, %{p}_c8 : i32",
        f"%{p}_b = arith.ori %{p}_l, %{p}_hs : i32",
    ]
    return indented(lines, indent) + "\n" + f16_bits_to_f32(f"%{p}_b", out, indent)


def f16_bits_to_f32(bits: str, out: str, indent: str = INDENT, specials: bool = False) -> str:
    """MLIR lines decoding f16 bits held in the low 16 bits of i32 `bits` into f32 `out` (the
    bits above them must be 0).

    Normal halves: as_f32(((bits & 0x7fff) << 13) + (112 << 23)) rebiases the exponent; subnormal
    halves (exponent 0, common for Q6_K/Q4_K super-block scales): uitofp(bits & 0x3ff) * 2^-24.
    Never goes through an f32 denormal, which llvm-cpu and Vulkan flush to zero. Exact for every
    finite half; inf/nan are not expected in scales. With `specials` (the KV slab's values, which
    `f32_to_f16_bits` rounds to inf past f16's range) inf and nan too: exponent 31 is rebiased
    by twice as much, to f32's 255.
    """
    p = out.lstrip("%")
    special = [
        f"%{p}_xm = arith.constant 31744 : i32",
        f"%{p}_xe = arith.andi {bits}, %{p}_xm : i32",
        f"%{p}_xs = arith.cmpi eq, %{p}_xe, %{p}_xm : i32",
        f"%{p}_xb = arith.addi %{p}_nb0, %{p}_bias : i32",
        f"%{p}_nb = arith.select %{p}_xs, %{p}_xb, %{p}_nb0 : i32",
    ]
    lines = [
        f"%{p}_m7 = arith.constant 32767 : i32",
        f"%{p}_em = arith.andi {bits}, %{p}_m7 : i32",
        f"%{p}_c13 = arith.constant 13 : i32",
        f"%{p}_e2 = arith.shli %{p}_em, %{p}_c13 : i32",
        f"%{p}_bias = arith.constant 939524096 : i32",
        f"%{p}_nb{'0' if specials else ''} = arith.addi %{p}_e2, %{p}_bias : i32",
        *(special if specials else []),
        f"%{p}_nf = arith.bitcast %{p}_nb : i32 to f32",
        f"%{p}_m10 = arith.constant 1023 : i32",
        f"%{p}_man = arith.andi {bits}, %{p}_m10 : i32",
        f"%{p}_mf = arith.uitofp %{p}_man : i32 to f32",
        f"%{p}_k = arith.constant 0x33800000 : f32",
        f"%{p}_sf = arith.mulf %{p}_mf, %{p}_k : f32",
        f"%{p}_ex = arith.constant 31744 : i32",
        f"%{p}_eb = arith.andi {bits}, %{p}_ex : i32",
        f"%{p}_z = arith.constant 0 : i32",
        f"%{p}_sub = arith.cmpi eq, %{p}_eb, %{p}_z : i32",
        f"%{p}_mag = arith.select %{p}_sub, %{p}_sf, %{p}_nf : f32",
        f"%{p}_mi = arith.bitcast %{p}_mag : f32 to i32",
        f"%{p}_ms = arith.constant 32768 : i32",
        f"%{p}_sg = arith.andi {bits}, %{p}_ms : i32",
        f"%{p}_c16 = arith.constant 16 : i32",
        f"%{p}_s2 = arith.shli %{p}_sg, %{p}_c16 : i32",
        f"%{p}_or = arith.ori %{p}_mi, %{p}_s2 : i32",
        f"{out} = arith.bitcast %{p}_or : i32 to f32",
    ]
    return indented(lines, indent)


def f32_to_f16_bits(x: str, out: str, indent: str = INDENT) -> str:
    """MLIR lines rounding f32 `x` to f16 as numpy's `astype(np.float16)` does (to nearest, ties
    to even; past f16's range to inf; nan stays nan) into the half's bits, the low 16 of i32 `out`
    (the high 16 are 0). Integer ops on x's bits, and one f32 add:

    - normal halves (|x| >= 2^-14): rebias the exponent and round away 13 mantissa bits,
      (a - (112 << 23) + 0xfff + ((a >> 13) & 1)) >> 13 with a = |x|'s bits: a carry out of the
      mantissa moves up the exponent, up to 0x7c00 (inf), where the result is clamped;
    - subnormal halves: |x| + 0.5 is rounded to a multiple of 2^-24 (0.5's ulp, the subnormal
      halves' step) by the float add, correctly rounded to nearest even on the CPU and in
      Vulkan, so its bits less 0.5's are the half's mantissa (0x400 when it rounds up to the
      smallest normal half, which is that half's bits). |x| is raised to 2^-25 first, which rounds
      to 0 (a tie, to even): every |x| at most that gives 0, and no f32 denormal is ever an operand;
    - the sign bit ORed in: -0.0, and negative values too small for a half, give 0x8000.
    """
    p = out.lstrip("%")
    lines = [
        f"%{p}_b = arith.bitcast {x} : f32 to i32",
        f"%{p}_m31 = arith.constant 2147483647 : i32",
        f"%{p}_a = arith.andi %{p}_b, %{p}_m31 : i32",
        f"%{p}_c16 = arith.constant 16 : i32",
        f"%{p}_bs = arith.shrui %{p}_b, %{p}_c16 : i32",
        f"%{p}_ms = arith.constant 32768 : i32",
        f"%{p}_sg = arith.andi %{p}_bs, %{p}_ms : i32",
        f"%{p}_c13 = arith.constant 13 : i32",
        f"%{p}_a13 = arith.shrui %{p}_a, %{p}_c13 : i32",
        f"%{p}_c1 = arith.constant 1 : i32",
        f"%{p}_odd = arith.andi %{p}_a13, %{p}_c1 : i32",
        f"%{p}_rb = arith.constant -939520001 : i32",  # 0xfff - (112 << 23)
        f"%{p}_n1 = arith.addi %{p}_a, %{p}_rb : i32",
        f"%{p}_n2 = arith.addi %{p}_n1, %{p}_odd : i32",
        f"%{p}_n3 = arith.shrui %{p}_n2, %{p}_c13 : i32",
        f"%{p}_inf = arith.constant 31744 : i32",
        f"%{p}_nm = arith.minui %{p}_n3, %{p}_inf : i32",
        f"%{p}_tiny = arith.constant 855638016 : i32",  # 2^-25
        f"%{p}_at = arith.maxui %{p}_a, %{p}_tiny : i32",
        f"%{p}_af = arith.bitcast %{p}_at : i32 to f32",
        f"%{p}_half = arith.constant 0.5 : f32",
        f"%{p}_sf = arith.addf %{p}_af, %{p}_half : f32",
        f"%{p}_sb = arith.bitcast %{p}_sf : f32 to i32",
        f"%{p}_hb = arith.constant 1056964608 : i32",  # 0.5's bits
        f"%{p}_sm = arith.subi %{p}_sb, %{p}_hb : i32",
        f"%{p}_min = arith.constant 947912704 : i32",  # 2^-14, the smallest normal half
        f"%{p}_isn = arith.cmpi uge, %{p}_a, %{p}_min : i32",
        f"%{p}_mag = arith.select %{p}_isn, %{p}_nm, %{p}_sm : i32",
        f"%{p}_finf = arith.constant 2139095040 : i32",  # f32 inf's bits
        f"%{p}_nan = arith.cmpi ugt, %{p}_a, %{p}_finf : i32",
        f"%{p}_qnan = arith.constant 32256 : i32",
        f"%{p}_mg = arith.select %{p}_nan, %{p}_qnan, %{p}_mag : i32",
        f"{out} = arith.ori %{p}_mg, %{p}_sg : i32",
    ]
    return indented(lines, indent)


def bf16_to_f32(lo: str, hi: str, out: str, indent: str = INDENT) -> str:
    """MLIR lines decoding a bf16 given as two i8 SSA values (little-endian): f32 bits = hi << 24 | lo << 16."""
    p = out.lstrip("%")
    lines = [
        f"%{p}_l = arith.extui {lo} : i8 to i32",
        f"%{p}_h = arith.extui {hi} : i8 to i32",
        f"%{p}_c16 = arith.constant 16 : i32",
        f"%{p}_c24 = arith.constant 24 : i32",
        f"%{p}_ls = arith.shli %{p}_l, %{p}_c16 : i32",
        f"%{p}_hs = arith.shli %{p}_h, %{p}_c24 : i32",
        f"%{p}_b = arith.ori %{p}_ls, %{p}_hs : i32",
        f"{out} = arith.bitcast %{p}_b : i32 to f32",
    ]
    return indented(lines, indent)


def kquant_scale(upper: str, indent: str = INDENT) -> str:
    """MLIR lines unpacking one Q4_K/Q5_K sub-block's 6-bit scale and min, times d and dmin.

    The 12 scale bytes are three rows of four, A (bytes 0-3), B (4-7) and C (8-11); sub-block
    s = 4u + i (u in {0, 1}, i < 4) reads A[i], B[i], C[i], given here as i8 values `%ka`, `%kb`,
    `%kc`, with the i1 `upper` = (u == 1) (`kquant_scale_words`). Defines f32 `%ds` = d * sc and
    `%dm` = dmin * m from the f32 `%d` and `%m` (dmin). The bytes are widened with extui first: on
    Vulkan an i8 `shrui` whose result is not masked back to the low bits gives wrong values (i8 is
    emulated in wider registers).
    """
    widen = [f"%ks_{r} = arith.extui %k{r} : i8 to i32" for r in "abc"]
    return indented(widen, indent) + "\n" + kquant_scale_words(
        ("%ks_a", "%ks_b", "%ks_c"), upper, ("%d", "%m"), ("%ds", "%dm"), "%ks", indent
    )


def kquant_scale_words(
    abc: tuple[str, str, str], upper: str, d_dmin: tuple[str, str], out: tuple[str, str], tag: str,
    indent: str = INDENT,
) -> str:
    """MLIR lines for `kquant_scale` from the bytes A[i], B[i], C[i] as i32 values 0-255 `abc`:
      u = 0: sc = A & 63,                  m = B & 63
      u = 1: sc = (C & 15) | (A >> 6) << 4, m = (C >> 4) | (B >> 6) << 4
    `out` = (d * sc, dmin * m) in f32; `tag` prefixes the SSA names of the steps."""
    a, b, c = abc
    t = tag
    lines = [
        f"{t}_c63 = arith.constant 63 : i32",
        f"{t}_c15 = arith.constant 15 : i32",
        f"{t}_c6 = arith.constant 6 : i32",
        f"{t}_c4 = arith.constant 4 : i32",
        f"{t}_sl = arith.andi {a}, {t}_c63 : i32",
        f"{t}_ml = arith.andi {b}, {t}_c63 : i32",
        f"{t}_a6 = arith.shrui {a}, {t}_c6 : i32",
        f"{t}_a4 = arith.shli {t}_a6, {t}_c4 : i32",
        f"{t}_cl = arith.andi {c}, {t}_c15 : i32",
        f"{t}_su = arith.ori {t}_cl, {t}_a4 : i32",
        f"{t}_b6 = arith.shrui {b}, {t}_c6 : i32",
        f"{t}_b4 = arith.shli {t}_b6, {t}_c4 : i32",
        f"{t}_ch = arith.shrui {c}, {t}_c4 : i32",
        f"{t}_mu = arith.ori {t}_ch, {t}_b4 : i32",
        f"{t}_sc = arith.select {upper}, {t}_su, {t}_sl : i32",
        f"{t}_mn = arith.select {upper}, {t}_mu, {t}_ml : i32",
        f"{t}_scf = arith.uitofp {t}_sc : i32 to f32",
        f"{t}_mnf = arith.uitofp {t}_mn : i32 to f32",
        f"{out[0]} = arith.mulf {d_dmin[0]}, {t}_scf : f32",
        f"{out[1]} = arith.mulf {d_dmin[1]}, {t}_mnf : f32",
    ]
    return indented(lines, indent)


def u32_from_bytes(b: tuple[str, str, str, str], out: str, indent: str = INDENT) -> str:
    """MLIR lines assembling i32 `out` from four little-endian i8 SSA values."""
    p = out.lstrip("%")
    lines = [f"%{p}_e0 = arith.extui {b[0]} : i8 to i32"]
    for i in (1, 2, 3):
        lines += [
            f"%{p}_e{i} = arith.extui {b[i]} : i8 to i32",
            f"%{p}_c{i} = arith.constant {8 * i} : i32",
            f"%{p}_s{i} = arith.shli %{p}_e{i}, %{p}_c{i} : i32",
        ]
    lines += [
        f"%{p}_o1 = arith.ori %{p}_e0, %{p}_s1 : i32",
        f"%{p}_o2 = arith.ori %{p}_o1, %{p}_s2 : i32",
        f"{out} = arith.ori %{p}_o2, %{p}_s3 : i32",
    ]
    return indented(lines, indent)


def q5_value(q: str, h: str, j: str, qh: str, out: str, indent: str = INDENT) -> str:
    """MLIR lines for a Q5_0/Q5_1 quant: i32 `out` = ((q >> 4h) & 15) | ((qh >> (16h + j)) & 1) << 4.

    `q` is the i8 nibble byte, `h` (nibble) and `j` (< 16) are index values, `qh` the block's i32
    high bits.
    """
    p = out.lstrip("%")
    lines = [
        f"%{p}_h = arith.index_cast {h} : index to i32",
        f"%{p}_j = arith.index_cast {j} : index to i32",
        f"%{p}_c4 = arith.constant 4 : i32",
        f"%{p}_c16 = arith.constant 16 : i32",
        f"%{p}_c15 = arith.constant 15 : i32",
        f"%{p}_c1 = arith.constant 1 : i32",
        f"%{p}_qi = arith.extui {q} : i8 to i32",
        f"%{p}_ns = arith.muli %{p}_h, %{p}_c4 : i32",
        f"%{p}_qs = arith.shrui %{p}_qi, %{p}_ns : i32",
        f"%{p}_qn = arith.andi %{p}_qs, %{p}_c15 : i32",
        f"%{p}_eh = arith.muli %{p}_h, %{p}_c16 : i32",
        f"%{p}_e = arith.addi %{p}_eh, %{p}_j : i32",
        f"%{p}_hs = arith.shrui {qh}, %{p}_e : i32",
        f"%{p}_hb = arith.andi %{p}_hs, %{p}_c1 : i32",
        f"%{p}_h4 = arith.shli %{p}_hb, %{p}_c4 : i32",
        f"{out} = arith.ori %{p}_qn, %{p}_h4 : i32",
    ]
    return indented(lines, indent)
