// y[T, n] = x[T, k] @ W[n, k]^T for a prompt chunk, W in tiled planes (compiler/tiled.py): the
// weight is dequantized once per call into W^T [K, N] f32, then one linalg.matmul, which IREE
// tiles, packs and vectorizes as a contraction. x is padded with zero rows to a multiple of 8:
// IREE's code for a ragged last tile of rows is slow (T = 9 took 3.5x T = 8 on the whole model).
// Placeholders: NAME, ARGS, N, K, MAPS, ITERS, INS, IN_TYPES, OUT_SHAPE, BB, SCALES, WEIGHT, COLLAPSE.
func.func private @${NAME}(${ARGS}, %x: tensor<?x${K}xf32>) -> tensor<?x${N}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<?x${K}xf32>
  %we = tensor.empty() : tensor<${OUT_SHAPE}xf32>
  %wt = linalg.generic {indexing_maps = [${MAPS}], iterator_types = [${ITERS}]}
      ins(${INS} : ${IN_TYPES}) outs(%we : tensor<${OUT_SHAPE}xf32>) {
    ^bb0(${BB}):
${SCALES}
${WEIGHT}
      linalg.yield %wv : f32
  } -> tensor<${OUT_SHAPE}xf32>
  %w = tensor.collapse_shape %wt ${COLLAPSE} : tensor<${OUT_SHAPE}xf32> into tensor<${K}x${N}xf32>
  %zero = arith.constant 0.0 : f32
  %c7 = arith.constant 7 : index
  %c8 = arith.constant 8 : index
  %t7 = arith.addi %T, %c7 : index
  %tq = arith.divui %t7, %c8 : index
  %Tp = arith.muli %tq, %c8 : index
  %extra = arith.subi %Tp, %T : index
  %xp = tensor.pad %x low[0, 0] high[%extra, 0] {
  ^bb0(%i: index, %j: index):
    tensor.yield %zero : f32
  } : tensor<?x${K}xf32> to tensor<?x${K}xf32>
  %e = tensor.empty(%Tp) : tensor<?x${N}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x${N}xf32>) -> tensor<?x${N}xf32>
  %yp = linalg.matmul ins(%xp, %w : tensor<?x${K}xf32>, tensor<${K}x${N}xf32>) outs(%acc : tensor<?x${N}xf32>) -> tensor<?x${N}xf32>
  %y = tensor.extract_slice %yp[0, 0] [%T, ${N}] [1, 1] : tensor<?x${N}xf32> to tensor<?x${N}xf32>
  return %y : tensor<?x${N}xf32>
}
