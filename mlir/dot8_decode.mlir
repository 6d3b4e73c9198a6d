// y[T, n] = x[T, k] @ W[n, k]^T with integer dot products (compiler/dot8.py): a dispatch written
// by hand. Decode: T = R static (1 for one token, the bucket size for a batch), one tile of R
// rows. Prefill: T = ? padded to a multiple of R = 8, tiles of 8 rows. The grid is 1-D (IREE's
// CPU runtime spreads workgroups over its threads along x): workgroup id = group chunk * tiles +
// tile, so neighbouring workgroups read the same weights from cache. W is in groups of 8 rows,
// each 32-byte load holding 4 consecutive bytes of each of the 8 rows; d (and m) are f16 bits
// (f32 for Q4_K, whose 32-blocks' scales are products of two GGUF fields) [groups, blocks, 8];
// Q5_0's fifth bits are one i32 word per load and nibble half [groups, blocks, 4, 2] (QH), OR-ed
// into the nibbles as 16 before the multiply. Each workgroup takes PER_WG groups and one tile: it quantizes the tile's x
// per 32-block to int8 (d_x = max|x| / 127, q = round-to-even(x * (127 / max|x|)) with vcvtps2dq, s_x = d_x * sum q), then
// per block and row multiplies bytes with vpmaddubsw (pairs into i16), adds pairs into i32 with
// vpmaddwd (Q5_0: in two parts, so that no i16 sum saturates), and accumulates d_w d_x sum
// (+ m_w s_x, m_w = -8 d_w for Q4_0, -16 d_w for Q5_0) in f32, 8 output rows per vector.
// Placeholders: NAME, WG_ARGS, WG_COUNT, WG_IDS, TP_ARG, TP, XR, PER_WG, NG, R, B, K, N, CONSTS, QS, DS,
// XQ, DX, QH, BINDINGS, WM, DSCALE, MSCALE, BODY, ITER_INIT, ITER_TYPES, YIELD, YIELD_TYPES, RESULTS, STORES,
// WRAPPER (the private func that dispatches it), VL (output rows per vector: 8, or 16 where two
// groups are side by side in 512 bits, see compiler/dot8.py `lanes`), VB (bytes per vector: 4 VL),
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
    func.func @${NAME}(${BINDINGS}, %b_x: !stream.binding, ${KV_BINDINGS}%b_y: !stream.binding${TP_ARG}${KV_ARGS}) {
${CONSTS}
    %wq = stream.binding.subspan %b_qs[%c0] : !stream.binding -> memref<${QS}>
    %wd = stream.binding.subspan %b_d[%c0] : !stream.binding -> memref<${DS}>
${WM}
    %x = stream.binding.subspan %b_x[%c0] : !stream.binding -> memref<${XR}x${B}x32xf32>${TP}
    %y = stream.binding.subspan %b_y[%c0] : !stream.binding -> memref<${XR}x${N}xf32>${TP}
${WG_IDS}
${KV_SETUP}
    %cRt = arith.constant ${R} : index
    %r0 = arith.muli %tile, %cRt : index
    %cR = arith.constant ${R} : index
    %cB = arith.constant ${B} : index
    %cNG = arith.constant ${NG} : index
    %cPW = arith.constant ${PER_WG} : index
    %xq = memref.alloca() : memref<${XQ}>
    %dx = memref.alloca() : memref<${DX}>
    %sx = memref.alloca() : memref<${DX}>
    %fzero = arith.constant 0.0 : f32
    %fmax = arith.constant 127.0 : f32
    scf.for %r = %c0 to %cR step %c1 {
      scf.for %b = %c0 to %cB step %c1 {
        %rx = arith.addi %r0, %r : index
        %v = vector.load %x[%rx, %b, %c0] : memref<${XR}x${B}x32xf32>, vector<32xf32>
        %av = math.absf %v : vector<32xf32>
        %ab = arith.bitcast %av : vector<32xf32> to vector<32xi32>
        %mb = vector.reduction <maxui>, %ab : vector<32xi32> into i32
        %mx = arith.bitcast %mb : i32 to f32
        %d = arith.divf %mx, %fmax : f32
        %nz = arith.cmpf ogt, %mx, %fzero : f32
        %inv0 = arith.divf %fmax, %mx : f32
        %inv = arith.select %nz, %inv0, %fzero : f32
        %invv = vector.broadcast %inv : f32 to vector<32xf32>
        %sc = arith.mulf %v, %invv : vector<32xf32>
        %s4 = vector.shape_cast %sc : vector<32xf32> to vector<4x8xf32>
        %s0 = vector.extract %s4[0] : vector<8xf32> from vector<4x8xf32>
        %s1 = vector.extract %s4[1] : vector<8xf32> from vector<4x8xf32>
        %s2 = vector.extract %s4[2] : vector<8xf32> from vector<4x8xf32>
        %s3 = vector.extract %s4[3] : vector<8xf32> from vector<4x8xf32>
        %q0 = llvm.call_intrinsic "llvm.x86.avx.cvt.ps2dq.256"(%s0) : (vector<8xf32>) -> vector<8xi32>
        %q1 = llvm.call_intrinsic "llvm.x86.avx.cvt.ps2dq.256"(%s1) : (vector<8xf32>) -> vector<8xi32>
        %q2 = llvm.call_intrinsic "llvm.x86.avx.cvt.ps2dq.256"(%s2) : (vector<8xf32>) -> vector<8xi32>
        %q3 = llvm.call_intrinsic "llvm.x86.avx.cvt.ps2dq.256"(%s3) : (vector<8xf32>) -> vector<8xi32>
        %z4 = arith.constant dense<0> : vector<4x8xi32>
        %i0 = vector.insert %q0, %z4[0] : vector<8xi32> into vector<4x8xi32>
        %i1 = vector.insert %q1, %i0[1] : vector<8xi32> into vector<4x8xi32>
        %i2 = vector.insert %q2, %i1[2] : vector<8xi32> into vector<4x8xi32>
        %i3 = vector.insert %q3, %i2[3] : vector<8xi32> into vector<4x8xi32>
        %qw = vector.shape_cast %i3 : vector<4x8xi32> to vector<32xi32>
        %qi = arith.trunci %qw : vector<32xi32> to vector<32xi8>
        vector.store %qi, %xq[%r, %b, %c0] : memref<${XQ}>, vector<32xi8>
        %p01 = arith.addi %q0, %q1 : vector<8xi32>
        %p23 = arith.addi %q2, %q3 : vector<8xi32>
        %p03 = arith.addi %p01, %p23 : vector<8xi32>
        %qsum = vector.reduction <add>, %p03 : vector<8xi32> into i32
        %qsf = arith.sitofp %qsum : i32 to f32
        %sd = arith.mulf %qsf, %d : f32
        memref.store %d, %dx[%r, %b] : memref<${DX}>
        memref.store %sd, %sx[%r, %b] : memref<${DX}>
      }
    }
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
