"""The CPU integer dot-product kernels' weight layout (zinc.compiler.dot8) and the host switches.

Owns: `DOT8_TYPES`, `enabled()` (the host has AVX2, F16C and FMA, and `ZINC_CPU_INT8` is not 0),
`vnni()` and `wide_enabled()` (which instructions the kernels use), and the grouped weight layout
(`plane_types`, `repack`: a byte shuffle of the GGUF blocks, 8 rows of a group side by side, 4
bytes of each row at a time; Q5_0's fifth bits re-ordered into one 32-bit word per load and nibble
half, see `_q5_0_fifth_bits`, and Q5_1's the same way; Q4_K into Q4_1-like 32-blocks, their 6-bit
scales and minimums a byte each and the super-block's d and dmin, 148 bytes a super-block to
GGUF's 144, and Q5_K the same with fifth-bit words, 180 bytes to GGUF's 176, `_repack_q4_k`; Q6_K
into Q4_0-like nibbles, their 2-bit highs beside them, int8 scales per 16 and the super-block's d,
`_repack_q6_k`). On a host with AVX-512 VNNI a weight whose groups pair up is repacked
with each pair side by side (`paired`, `_pair`: 64 bytes per load, 16 scales), and every kernel
over it reads 16 output rows per `vpdpbusd` (`lanes`).
`zinc compile` runs `repack` once per weight and writes the planes to the artifact's `.irpa`.
Imports: numpy, zinc.compiler.kernels (QuantType), zinc.compiler.targets (the host's CPU flags).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from zinc.compiler.kernels import QuantType
from zinc.compiler.targets import target_cpu_flags

G = 8  # output rows per vector: a group of rows is interleaved 4 bytes at a time
# type -> 32-byte loads per block
DOT8_TYPES = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 4, "Q5_1": 4, "Q8_0": 8, "Q4_K": 4, "Q5_K": 4, "Q6_K": 4}
FIFTH_BIT = ("Q5_0", "Q5_1", "Q5_K")  # nibbles plus a fifth bit from a `qh` plane (`_q5_0_fifth_bits`)
# scale planes in f32: Q6_K's super-block d (one per 256 weights; its int8 scales per 16 weights
# are a plane `sc` of their own). Q4_K's and Q5_K's d and dmin per 256 stay f16 bits, their
# scales and minimums per 32 a byte each (`sc`).
F32_SCALES = ("Q6_K",)
SUPER_BLOCK = ("Q4_K", "Q5_K", "Q6_K")  # their `d` (and `m`) planes hold one scale per 256 weights
# the types with a 512-bit form: all. Q8_0 reads twice the bytes per product and was left out
# while the quants were prefetched into L1 (two groups' streams at once, as they were before the
# planes held a pair side by side, made SmolLM2's output head in a batch of 4 slower, 785 -> 900
# us); prefetched into L2, its wide form is no slower for 4 rows and faster for 8: SmolLM2's step
# 4.11 -> 3.94 ms, Gemma 3's 10.07 -> 9.00 ms
WIDE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
U8 = np.ndarray[Any, np.dtype[np.uint8]]


def host_supports() -> bool:
    """AVX2 (the byte dot products), F16C (scale decoding) and FMA."""
    return {"avx2", "f16c", "fma"} <= target_cpu_flags()


def enabled() -> bool:
    return os.environ.get("ZINC_CPU_INT8", "1") != "0" and host_supports()


def host_vnni() -> bool:
    """`vpdpbusd` in 256 bits: AVX-VNNI, or AVX-512 VNNI with VL."""
    flags = target_cpu_flags()
    return "avx_vnni" in flags or {"avx512_vnni", "avx512vl"} <= flags


def vnni() -> bool:
    """Whether the kernels multiply-accumulate bytes with `vpdpbusd` (one instruction into i32)
    instead of `vpmaddubsw` + `vpmaddwd` + add; `ZINC_CPU_VNNI=0` keeps the AVX2 form."""
    return os.environ.get("ZINC_CPU_VNNI", "1") != "0" and host_vnni()


def host_wide() -> bool:
    """`vpdpbusd` in 512 bits: AVX-512 F, BW and VNNI."""
    return {"avx512f", "avx512bw", "avx512_vnni"} <= target_cpu_flags()


def wide_enabled() -> bool:
    """Whether kernels may put two groups of 8 rows side by side in 512-bit vectors (16 output
    rows per `vpdpbusd`, half the instructions per product of the 256-bit form); `ZINC_CPU_WIDE=0`
    keeps 256 bits. Each output lane does the same operations either way, so results are equal."""
    return os.environ.get("ZINC_CPU_WIDE", "1") != "0" and vnni() and host_wide()


def paired(q: QuantType, n: int) -> bool:
    """Whether an [n, k] weight of type `q` is repacked in pairs of groups (`repack`) and every
    kernel over it, of one row or many, reads 16 output rows per vector: `wide_enabled()`, the
    type is one of `WIDE_TYPES` and the groups of 8 rows pair up."""
    return wide_enabled() and q.name in WIDE_TYPES and (n // G) % 2 == 0


def lanes(q: QuantType, n: int, rows: int) -> int:
    """Output rows per vector of a kernel over `rows` activation rows for an [n, k] weight of type
    `q`: 16 where the weight is `paired`, else 8. The same for every `rows`: the planes hold the
    pairs side by side, and a kernel of 8 lanes would read each 64-byte line in two halves."""
    del rows  # one layout serves the kernels of every row count
    return 16 if paired(q, n) else 8


def supports(q: QuantType, n: int, k: int) -> bool:
    return q.name in DOT8_TYPES and n % G == 0 and k % q.block == 0


def plane_types(q: QuantType, n: int, k: int) -> dict[str, str]:
    """Planes of an [n, k] weight: quants [n/8, k/32, loads, 8 rows, 4 bytes], scales
    [n/8, k/32, 8 rows] as f16 bits, and the same again for the minimums of Q4_1 and Q5_1
    (`m`); Q4_K's and Q5_K's (`_repack_q4_k`) d and -dmin [n/8, k/256, 8 rows] as f16 bits and
    the 6-bit scale and minimum of each 32-block `sc` [n/8, k/32, 2, 8 rows] as bytes; Q6_K's
    (`_repack_q6_k`) 2-bit highs `hb`, int8 scales `sc` [n/8, k/32, 2 halves, 8 rows] and
    super-block d [n/8, k/256, 8 rows] in f32; the fifth bits of Q5_0, Q5_1 and Q5_K `qh`
    [n/8, k/32, 4 loads, 2 nibble halves] as i32 words. A `paired` weight has n/16 pairs of 16
    rows where these have n/8 groups of 8 (`qh` stays per group)."""
    ng, b, loads = n // G, k // 32, DOT8_TYPES[q.name]
    scale = "f32" if q.name in F32_SCALES else "i16"
    units, v = (ng // 2, 2 * G) if paired(q, n) else (ng, G)  # a pair: its two groups side by side
    out = {"qs": f"tensor<{units}x{b}x{loads}x{v}x4xi8>", "d": f"tensor<{units}x{b}x{v}x{scale}>"}
    if q.name in SUPER_BLOCK:
        out["d"] = f"tensor<{units}x{b // 8}x{v}x{scale}>"
    if q.name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):
        out["m"] = out["d"]
    if q.name == "Q6_K":  # 2-bit highs [.., 2 loads, rows, 4 bytes]
        out["hb"] = f"tensor<{units}x{b}x2x{v}x4xi8>"
    if q.name in SUPER_BLOCK:  # per 32-block: Q4_K's and Q5_K's scale and minimum, Q6_K's per half
        out["sc"] = f"tensor<{units}x{b}x2x{v}xi8>"
    if q.name in FIFTH_BIT:
        out["qh"] = f"tensor<{ng}x{b}x4x2xi32>"
    return out


def repack(q: QuantType, raw: U8, n: int, k: int) -> dict[str, np.ndarray[Any, Any]]:
    """The planes of one GGUF tensor (`raw`: its bytes). For the 32-weight block types a byte
    shuffle (scales stay f16 bits, sizes equal GGUF's); K-quants are unpacked, see below. A
    `paired` weight's planes hold each pair of groups side by side (`_pair`)."""
    if q.name in ("Q4_K", "Q5_K"):
        planes = _repack_q4_k(raw, n, k, q.name == "Q5_K")
    elif q.name == "Q6_K":
        planes = _repack_q6_k(raw, n, k)
    else:
        return _repack_blocks(q, raw, n, k)
    if paired(q, n):
        planes = {p: a if p == "qh" else _pair(a) for p, a in planes.items()}
    return planes


def _pair(plane: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """[n/8, b, ..., 8 rows, ...] -> [n/16, b, ..., 16 rows, ...]: groups 2i and 2i + 1 side by
    side in each block (a load's 32 bytes of one then of the other, 64 in all; their 8 scales
    each, 16 in all), so that a 512-bit kernel reads a pair with one load, not two and a shuffle."""
    ng, b, *rest = plane.shape
    at = len(rest) - 2 if len(rest) == 3 else len(rest) - 1  # rows: quants [loads, 8, 4], scales [.., 8]
    pairs = plane.reshape(ng // 2, 2, b, *rest)
    order = [0, 2, *range(3, 3 + at), 1, *range(3 + at, 3 + len(rest))]
    merged = [*rest[:at], 2 * G, *rest[at + 1 :]]
    return np.ascontiguousarray(pairs.transpose(order)).reshape(ng // 2, b, *merged)


def _repack_blocks(q: QuantType, raw: U8, n: int, k: int) -> dict[str, np.ndarray[Any, Any]]:
    """The planes of a 32-weight block type. A pair of groups is 16 consecutive rows, so grouping
    and pairing are one transpose, of 4-byte words (a quarter of the element moves of bytes)."""
    ng, b, loads = n // G, k // 32, DOT8_TYPES[q.name]
    v = 2 * G if paired(q, n) else G  # rows side by side in a plane's unit
    blocks = np.ascontiguousarray(raw).reshape(n, b, q.block_bytes)
    head = {"Q4_1": 4, "Q5_0": 6, "Q5_1": 8}.get(q.name, 2)  # bytes before the quants
    words = np.ascontiguousarray(blocks[:, :, head:]).view("<u4")  # [n, b, loads]
    qs = np.ascontiguousarray(words.reshape(n // v, v, b, loads).transpose(0, 2, 3, 1))
    out = {"qs": qs.view(np.int8).reshape(n // v, b, loads, v, 4)}

    def scale(lo: int) -> np.ndarray[Any, Any]:
        bits = np.ascontiguousarray(blocks[:, :, lo : lo + 2]).view(np.int16)[..., 0]
        return np.ascontiguousarray(bits.reshape(n // v, v, b).transpose(0, 2, 1))

    out["d"] = scale(0)
    if q.name in ("Q4_1", "Q5_1"):
        out["m"] = scale(2)
    if q.name in FIFTH_BIT:
        out["qh"] = _q5_0_fifth_bits(blocks, ng, b, head - 4)
    return out


def _q5_0_fifth_bits(blocks: U8, ng: int, b: int, at: int = 2) -> np.ndarray[Any, Any]:
    """Q5_0's fifth bits (the u32 `qh` at byte `at` of each block: 2, after its f16 d; Q5_1's at
    4, after d and m; bit j is element j's, and the 16 nibble bytes hold elements j and 16 + j in
    byte j) as the `qh` plane: per group, block, load s
    and nibble half h (0: low nibbles, elements 4s + i; 1: high, elements 16 + 4s + i) one 32-bit
    word whose bit 8i + r is the fifth bit of element 16h + 4s + i of the group's row r. Broadcast
    to the 8 dwords of a vector, byte 4r + i (the load's byte of row r, element i) then holds that
    bit as bit r: the kernel tests it against a constant mask, no shuffle. Sizes equal GGUF's."""
    qh = blocks[:, :, at : at + 4].copy().view("<u4")[..., 0]  # [n, b]
    bits = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [n, b, element]
    bits = bits.reshape(ng, G, b, 2, 4, 4).transpose(0, 2, 4, 3, 5, 1)  # [ng, b, s, h, i, r]
    words = np.packbits(bits, axis=-1, bitorder="little")[..., 0]  # [ng, b, s, h, i]: byte i, bit r
    return np.ascontiguousarray(words).view("<i4")[..., 0].astype(np.int32)


def _group(qs: np.ndarray[Any, Any], ng: int, b: int, loads: int) -> np.ndarray[Any, Any]:
    """Quant bytes [n, b, 4 * loads] -> [n/8, b, loads, 8 rows, 4 bytes]."""
    grouped = qs.reshape(ng, G, b, loads, 4).transpose(0, 2, 3, 1, 4)
    return np.ascontiguousarray(grouped).view(np.int8)


def _repack_q4_k(raw: U8, n: int, k: int, five: bool = False) -> dict[str, np.ndarray[Any, Any]]:
    """Q4_K super-blocks (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
    nibbles: chunk c of 64 weights is 32 bytes, low nibbles first) as Q4_1-like 32-blocks:
    nibbles re-paired (byte i = element i | element 16 + i << 4, `qs`), each 32-block's 6-bit
    scale sc and minimum m a byte each (`sc`), and the super-block's d and -dmin as f16 bits (`d`,
    `m`): 148 bytes where GGUF has 144 (a decode step reads every one). The kernel's scale
    d * sc and minimum -dmin * m are exact products in f32. With `five`, Q5_K's (the same fields
    with 32 bytes of fifth bits before the nibbles: bit j of byte l is element l of 32-block j):
    its fifth bits as Q5_0's `qh` words (`_q5_0_fifth_bits`), 180 bytes to GGUF's 176."""
    nb, b, ng = k // 256, k // 32, n // G
    head = 48 if five else 16  # bytes before the nibbles
    blocks = np.ascontiguousarray(raw).reshape(n, nb, head + 128)
    s = blocks[:, :, 4:16]
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    q = blocks[:, :, head:].reshape(n, nb, 4, 1, 32)
    vals = np.concatenate([q & 15, q >> 4], axis=3).reshape(n, b, 32)  # sub-block 2c: low, 2c + 1: high
    packed = (vals[..., :16] | (vals[..., 16:] << 4)).astype(np.uint8)

    def plane(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # [n, nb] f16 -> [n/8, nb, 8] bits
        return np.ascontiguousarray(a.view(np.int16).reshape(ng, G, nb).transpose(0, 2, 1))

    per_block = np.stack([sc, mn], axis=-1).astype(np.int8)  # [n, nb, 8 blocks, 2]: all below 64
    out = {
        "qs": _group(packed, ng, b, 4),
        "d": plane(blocks[:, :, 0:2].copy().view(np.float16)[..., 0]),
        "m": plane(-blocks[:, :, 2:4].copy().view(np.float16)[..., 0]),
        "sc": np.ascontiguousarray(per_block.reshape(ng, G, b, 2).transpose(0, 2, 3, 1)),
    }
    if five:  # each 32-block's bits as the u32 a Q5_0 block holds after its d (bit l: element l)
        bits = (blocks[:, :, 16:48, None] >> np.arange(8, dtype=np.uint8)) & 1  # [n, nb, l, block j]
        words = np.packbits(bits.transpose(0, 1, 3, 2), axis=-1, bitorder="little")  # [n, nb, j, 4]
        q5 = np.zeros((n, b, 6), dtype=np.uint8)
        q5[:, :, 2:6] = words.reshape(n, b, 4)
        out["qh"] = _q5_0_fifth_bits(q5, ng, b)
    return out


def _repack_q6_k(raw: U8, n: int, k: int) -> dict[str, np.ndarray[Any, Any]]:
    """Q6_K super-blocks (128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, f16 d)
    in 32-blocks with no more bytes than GGUF's (a token reads every one): the low nibbles paired as
    Q4_0's (byte i = element i | element 16 + i << 4, `qs`), the 2-bit highs of load s (2p + t)
    in the bits 4t (element 4s + j) and 4t + 2 (element 16 + 4s + j) of byte j of load p (`hb`), the
    int8 scale of each half of the block (`sc`) and the super-block's d in f32 (`d`). The kernel
    multiplies the unsigned quants and takes 32 times the half's activation sum off."""
    nb, b, ng = k // 256, k // 32, n // G
    blocks = np.ascontiguousarray(raw).reshape(n, nb, 210)
    ql = blocks[:, :, 0:128].reshape(n, nb, 2, 2, 32)  # [half, l >= 32, l]
    qh = blocks[:, :, 128:192].reshape(n, nb, 2, 1, 32)  # [half, l]
    low = np.concatenate([ql & 15, ql >> 4], axis=3).reshape(n, b, 32)  # weight order
    high = np.concatenate([(qh >> (2 * j)) & 3 for j in range(4)], axis=3).reshape(n, b, 32)
    packed = (low[..., :16] | (low[..., 16:] << 4)).astype(np.uint8)
    h = high.reshape(n, b, 2, 2, 2, 4).astype(np.uint8)  # element 16 h + 8 p + 4 t + j: [h, p, t, j]
    hb = h[:, :, 0, :, 0] | (h[:, :, 1, :, 0] << 2) | (h[:, :, 0, :, 1] << 4) | (h[:, :, 1, :, 1] << 6)
    sc = blocks[:, :, 192:208].view(np.int8).reshape(n, b, 2)
    d = blocks[:, :, 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    return {
        "qs": _group(packed, ng, b, 4),
        "hb": _group(np.ascontiguousarray(hb).reshape(n, b, 8), ng, b, 2),
        "sc": np.ascontiguousarray(sc.reshape(ng, G, b, 2).transpose(0, 2, 3, 1)),
        "d": np.ascontiguousarray(d.reshape(ng, G, nb).transpose(0, 2, 1)),
    }
