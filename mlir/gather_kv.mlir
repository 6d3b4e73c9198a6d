// One layer's cached K or V rows gathered from the slot-major KV slab by slot index.
// cache [NS, L, 2, HKV, HD]; ctx [${CTX_SHAPE}] holds the slot of each cached position;
// result [${CTX_SHAPE}, HKV, HD]. Slots never written must not be gathered (the caller points
// padding at the zeroed scratch slot 0).
func.func private @${NAME}(%cache: tensor<?x${L}x2x${HKV}x${HD}xf32>, %ctx: tensor<${CTX}xi32>, %layer: index,
                           %part: index) -> tensor<${CTX}x${HKV}x${HD}xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  ${DIMS}
  %e = tensor.empty(${DYN_CTX}) : tensor<${CTX}x${HKV}x${HD}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(${IDX}, h, d) -> (${IDX})>, affine_map<(${IDX}, h, d) -> (${IDX}, h, d)>],
      iterator_types = [${PAR}, "parallel", "parallel"]}
      ins(%ctx : tensor<${CTX}xi32>) outs(%e : tensor<${CTX}x${HKV}x${HD}xf32>) {
    ^bb0(%slot: i32, %o: f32):
      %h = linalg.index ${H_AT} : index
      %d = linalg.index ${D_AT} : index
      %si = arith.index_cast %slot : i32 to index
      %v = tensor.extract %cache[%si, %layer, %part, %h, %d] : tensor<?x${L}x2x${HKV}x${HD}xf32>
      linalg.yield %v : f32
  } -> tensor<${CTX}x${HKV}x${HD}xf32>
  return %r : tensor<${CTX}x${HKV}x${HD}xf32>
}
