// One layer's cached K or V rows of one sequence gathered from the slot-major KV slab by slot.
// cache: the slab (SLAB: [NS, L, 2, HKV, HD] f16 or f32, or HD / 2 i32 words of two f16 each); ctx [S]
// holds the slot of each cached position; result [S, HKV, HD] in f32 (LOAD: loads value (%h, %d)
// of the slot, widens or unpacks it to f32 and yields it: zinc.compiler.paged.slab_read).
// Slots never written must not be gathered (the caller points padding at the zeroed scratch slot 0).
func.func private @${NAME}(%cache: ${SLAB}, %ctx: tensor<?xi32>, %layer: index,
                           %part: index) -> tensor<?x${HKV}x${HD}xf32> {
  %c0 = arith.constant 0 : index
  %S = tensor.dim %ctx, %c0 : tensor<?xi32>
  %e = tensor.empty(%S) : tensor<?x${HKV}x${HD}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(s, h, d) -> (s)>, affine_map<(s, h, d) -> (s, h, d)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%ctx : tensor<?xi32>) outs(%e : tensor<?x${HKV}x${HD}xf32>) {
    ^bb0(%slot: i32, %o: f32):
      %h = linalg.index 1 : index
      %d = linalg.index 2 : index
      %si = arith.index_cast %slot : i32 to index
      ${LOAD}
  } -> tensor<?x${HKV}x${HD}xf32>
  return %r : tensor<?x${HKV}x${HD}xf32>
}
