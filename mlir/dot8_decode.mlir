// y[T, n] = x[T, k] @ W[n, k]^T with integer dot products (compiler/dot8.py): a dispatch written
// by hand. Decode: T = R static (1 for one token, the bucket size for a batch), one tile of R
// rows. Prefill: T = ? padded to a multiple of R = 8, tiles of 8 rows. The grid is 1-D (IREE's
// CPU runtime spreads workgroups over its threads along x): workgroup id = group chunk * tiles +
// tile, so neighbouring workgroups read the same weights from cache. W is in groups of 8 rows,
// each 32-byte load holding 4 consecutive bytes of each of the 8 rows; d (and m) are f16 bits
// [groups, blocks, 8] (Q4_K's one per 256 weights, times a byte per block in SC; Q6_K's f32);
// Q5_0's fifth bits are one i32 word per load and nibble half [groups, blocks, 4, 2] (QH), OR-ed
// into the nibbles as 16 before the multiply. Each workgroup takes PER_WG groups and one tile: it quantizes the tile's x
// per 32-block to int8 (d_x = max|x| / 127, q = round-to-even(x * (127 / max|x|)) with vcvtps2dq, s_x = d_x * sum q), then
// per block and row multiplies bytes with vpmaddubsw (pairs into i16), adds pairs into i32 with
// vpmaddwd (Q5_0: in two parts, so that no i16 sum saturates), and accumulates d_w d_x sum
// (+ m_w s_x, m_w = -8 d_w for Q4_0, -16 d_w for Q5_0) in f32, 8 output rows per vector.
// Placeholders: NAME, WG_ARGS, WG_COUNT, WG_IDS, TP_ARG, TP, XR, PER_WG, NG, R, B, K, N, CONSTS, QS, DS,
// XQ, DX, QH, BINDINGS, WM, DSCALE, MSCALE, BODY, ITER_INIT, ITER_TYPES, YIELD, YIELD_TYPES, RESULTS, STORES,
// WRAPPER (the private func that dispatches it), VL (output rows per vector: 8, or 16 where two
// groups are side by side in 512 bits, see compiler/dot8_layout.py `lanes`), VB (bytes per vector: 4 VL),
// and KV_BINDINGS, KV_ARGS, KV_SETUP, KV_PREFETCH: empty, or (a decode kernel that also prefetches
// a layer's cached K/V rows, compiler/kv_prefetch.py) its operands and the prefetch of one cached
// position per iteration of the block loop.
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups(${WG_ARGS}) -> (index, index, index) {
${WG_COUNT}
    %c1 = arith.constant 1 : index
    stream.return %x, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(${BINDINGS}, ${X_BINDINGS}, ${KV_BINDINGS}%b_y: !stream.binding${TP_ARG}${KV_ARGS}) {
${CONSTS}
    %wq = stream.binding.subspan %b_qs[%c0] : !stream.binding -> memref<${QS}>
    %wd = stream.binding.subspan %b_d[%c0] : !stream.binding -> memref<${DS}>
${WM}
    %y = stream.binding.subspan %b_y[%c0] : !stream.binding -> memref<${XR}x${N}xf32>${TP}
${WG_IDS}
${KV_SETUP}
    %cRt = arith.constant ${R} : index
    %r0 = arith.muli %tile, %cRt : index
    %cR = arith.constant ${R} : index
    %cB = arith.constant ${B} : index
    %cNG = arith.constant ${NG} : index
    %cPW = arith.constant ${PER_WG} : index
${X_SETUP}
    %m15 = arith.constant dense<15> : vector<${VB}xi8>
    %c4v = arith.constant dense<4> : vector<${VB}xi8>
    %ones = arith.constant dense<1> : vector<16xi16>
    %zi8 = arith.constant dense<0> : vector<${VL}xi32>
    %zb = arith.constant dense<0> : vector<${VB}xi8>
    %m8 = arith.constant dense<-8.0> : vector<${VL}xf32>
    %zf = arith.constant dense<0.0> : vector<${VL}xf32>
    %g0 = arith.muli %wg, %cPW : index
    %g1a = arith.addi %g0, %cPW : index
    %g1 = arith.minui %g1a, %cNG : index
    scf.for %g = %g0 to %g1 step %c1 {
      %ga = arith.muli %g, %c2 : index  // with 16 lanes %g is a pair of groups: %ga and %gb
      %gb = arith.addi %ga, %c1 : index
      ${RESULTS} = scf.for %b = %c0 to %cB step %c1 iter_args(${ITER_INIT}) -> (${ITER_TYPES}) {
${KV_PREFETCH}
          ${DSCALE}
          ${MSCALE}
${BODY}
        scf.yield ${YIELD} : ${YIELD_TYPES}
      }
      %n0 = arith.muli %g, %c${VL} : index
${STORES}
    }
    return
    }
  }
}
${WRAPPER}
