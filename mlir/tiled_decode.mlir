// y[1, n] = x[1, k] @ W[n, k]^T for one token, W in tiled planes (compiler/tiled.py): quants
// [N/TW, B, 32 or 16, TW] i8 and f16-bit scales [N/TW, B, TW] i16, the TW rows of a tile innermost.
// The product feeding the accumulator is `math.fma(w, x, -0.0)`, not `arith.mulf`, so IREE keeps
// this a plain vectorized generic; the compilation_info vectorizes n and steps every reduction.
// Placeholders: NAME, ARGS, N, K, NT, TW, XSHAPE, XEXPAND, INFO, MAPS, ITERS, INS, IN_TYPES, BB,
// SCALES (fragment -> %d [, %m]), WEIGHT (fragment -> %wv).
func.func private @${NAME}(${ARGS}, %x: tensor<1x${K}xf32>) -> tensor<1x${N}xf32> {
  %xc = tensor.collapse_shape %x [[0, 1]] : tensor<1x${K}xf32> into tensor<${K}xf32>
  %xb = tensor.expand_shape %xc ${XEXPAND} : tensor<${K}xf32> into tensor<${XSHAPE}xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<${NT}x${TW}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<${NT}x${TW}xf32>) -> tensor<${NT}x${TW}xf32>
  %r = linalg.generic {compilation_info = ${INFO},
      indexing_maps = [${MAPS}], iterator_types = [${ITERS}]}
      ins(${INS} : ${IN_TYPES}) outs(%acc : tensor<${NT}x${TW}xf32>) {
    ^bb0(${BB}):
${SCALES}
${WEIGHT}
      %nz = arith.constant -0.0 : f32
      %u = math.fma %wv, %xv, %nz : f32
      %s = arith.addf %a, %u : f32
      linalg.yield %s : f32
  } -> tensor<${NT}x${TW}xf32>
  %y = tensor.collapse_shape %r [[0, 1]] : tensor<${NT}x${TW}xf32> into tensor<${N}xf32>
  %y1 = tensor.expand_shape %y [[0, 1]] output_shape [1, ${N}] : tensor<${N}xf32> into tensor<1x${N}xf32>
  return %y1 : tensor<1x${N}xf32>
}
