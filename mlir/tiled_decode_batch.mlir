// y[R, n] = x[R, k] @ W[n, k]^T for a batch of R tokens (batched decode, one per sequence), W in
// tiled planes as in tiled_decode.mlir. The batch row r is one more parallel loop; the
// compilation_info puts a tile of rows inside the vector body, so each weight is dequantized
// once per row tile and used for every row of it. Placeholders as in tiled_decode.mlir plus R.
func.func private @${NAME}(${ARGS}, %x: tensor<${R}x${K}xf32>) -> tensor<${R}x${N}xf32> {
  %xb = tensor.expand_shape %x ${XEXPAND} : tensor<${R}x${K}xf32> into tensor<${R}x${XSHAPE}xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<${R}x${NT}x${TW}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<${R}x${NT}x${TW}xf32>) -> tensor<${R}x${NT}x${TW}xf32>
  %r = linalg.generic {compilation_info = ${INFO},
      indexing_maps = [${MAPS}], iterator_types = [${ITERS}]}
      ins(${INS} : ${IN_TYPES}) outs(%acc : tensor<${R}x${NT}x${TW}xf32>) {
    ^bb0(${BB}):
${SCALES}
${WEIGHT}
      %nz = arith.constant -0.0 : f32
      %u = math.fma %wv, %xv, %nz : f32
      %s = arith.addf %a, %u : f32
      linalg.yield %s : f32
  } -> tensor<${R}x${NT}x${TW}xf32>
  %y = tensor.collapse_shape %r [[0], [1, 2]] : tensor<${R}x${NT}x${TW}xf32> into tensor<${R}x${N}xf32>
  return %y : tensor<${R}x${N}xf32>
}
