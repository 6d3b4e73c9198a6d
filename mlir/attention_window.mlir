// Causal grouped-query attention of T new tokens at positions start + t, with a sliding window
// (gemma3's local layers; WINDOW is huge elsewhere) and a given query scale. k/v [S, HKV, HD] hold
// the sequence's keys and values by position: row s is position s (rows < start gathered from the
// slab by slot, rows start..start+T-1 this step's, the rest padding that no query sees). Every
// query reduces over the same row order whatever part of it came from the cache, so a position
// gets the same result bit for bit whether its prompt was prefilled whole, in chunks, or after a
// cached prefix. q [T, H*HD] with H = HKV * G query heads. Query t sees key s only if
// s <= start + t and start + t - s < WINDOW. Softmax in f32 with the max subtracted; the
// probabilities are divided by their sum before the weighted sum of values: dividing that sum
// [T, HKV, G, HD] by the row sums read transposed ([HKV, G, T]) afterwards came out inf for rows
// past the eighth on Vulkan (IREE 3.13, lavapipe; tests/kernels/test_window_attention.py).
func.func private @${NAME}(%q: tensor<${T}x${HHD}xf32>, %k: tensor<?x${HKV}x${HD}xf32>, %v: tensor<?x${HKV}x${HD}xf32>,
                           %start: index) -> tensor<${T}x${HHD}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %q, %c0 : tensor<${T}x${HHD}xf32>
  %S = tensor.dim %k, %c0 : tensor<?x${HKV}x${HD}xf32>
  %z = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %scale = arith.constant ${SCALE} : f32
  %qg = tensor.expand_shape %q [[0], [1, 2, 3]] output_shape [${TV}, ${HKV}, ${G}, ${HD}]
      : tensor<${T}x${HHD}xf32> into tensor<${T}x${HKV}x${G}x${HD}xf32>
  // scores: [HKV, G, T, S]
  %es = tensor.empty(${DYN_S}) : tensor<${HKV}x${G}x${T}x?xf32>
  %s0 = linalg.fill ins(%z : f32) outs(%es : tensor<${HKV}x${G}x${T}x?xf32>) -> tensor<${HKV}x${G}x${T}x?xf32>
  %sr = linalg.generic {indexing_maps = [affine_map<(g, r, t, s, d) -> (t, g, r, d)>,
        affine_map<(g, r, t, s, d) -> (s, g, d)>, affine_map<(g, r, t, s, d) -> (g, r, t, s)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%qg, %k : tensor<${T}x${HKV}x${G}x${HD}xf32>, tensor<?x${HKV}x${HD}xf32>) outs(%s0 : tensor<${HKV}x${G}x${T}x?xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %m = arith.mulf %a, %b : f32
      %r = arith.addf %o, %m : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}x?xf32>
  // key s is visible to query t when s <= start + t and start + t - s < WINDOW
  %sm = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t, s)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%sr : tensor<${HKV}x${G}x${T}x?xf32>) outs(%es : tensor<${HKV}x${G}x${T}x?xf32>) {
    ^bb0(%a: f32, %o: f32):
      %t = linalg.index 2 : index
      %s = linalg.index 3 : index
      %qp = arith.addi %start, %t : index
      %causal = arith.cmpi ule, %s, %qp : index
      %d = arith.subi %qp, %s : index
      %w = arith.constant ${WINDOW} : index
      %near = arith.cmpi ult, %d, %w : index
      %ok = arith.andi %causal, %near : i1
      %r = arith.select %ok, %a, %ninf : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}x?xf32>
  // max, exp, sum
  %em = tensor.empty(${DYN}) : tensor<${HKV}x${G}x${T}xf32>
  %m0 = linalg.fill ins(%ninf : f32) outs(%em : tensor<${HKV}x${G}x${T}xf32>) -> tensor<${HKV}x${G}x${T}xf32>
  %mx = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%sm : tensor<${HKV}x${G}x${T}x?xf32>) outs(%m0 : tensor<${HKV}x${G}x${T}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.maximumf %a, %o : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}xf32>
  %p = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t)>,
        affine_map<(g, r, t, s) -> (g, r, t, s)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%sm, %mx : tensor<${HKV}x${G}x${T}x?xf32>, tensor<${HKV}x${G}x${T}xf32>) outs(%es : tensor<${HKV}x${G}x${T}x?xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %d = arith.subf %a, %b : f32
      %sd = arith.mulf %d, %scale : f32
      %r = math.exp %sd : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}x?xf32>
  %l0 = linalg.fill ins(%z : f32) outs(%em : tensor<${HKV}x${G}x${T}xf32>) -> tensor<${HKV}x${G}x${T}xf32>
  %l = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%p : tensor<${HKV}x${G}x${T}x?xf32>) outs(%l0 : tensor<${HKV}x${G}x${T}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.addf %a, %o : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}xf32>
  %pn = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t)>,
        affine_map<(g, r, t, s) -> (g, r, t, s)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%p, %l : tensor<${HKV}x${G}x${T}x?xf32>, tensor<${HKV}x${G}x${T}xf32>) outs(%es : tensor<${HKV}x${G}x${T}x?xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %r = arith.divf %a, %b : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}x?xf32>
  %eo = tensor.empty(${DYN}) : tensor<${T}x${HKV}x${G}x${HD}xf32>
  %o0 = linalg.fill ins(%z : f32) outs(%eo : tensor<${T}x${HKV}x${G}x${HD}xf32>) -> tensor<${T}x${HKV}x${G}x${HD}xf32>
  %on = linalg.generic {indexing_maps = [affine_map<(t, g, r, d, s) -> (g, r, t, s)>,
        affine_map<(t, g, r, d, s) -> (s, g, d)>, affine_map<(t, g, r, d, s) -> (t, g, r, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%pn, %v : tensor<${HKV}x${G}x${T}x?xf32>, tensor<?x${HKV}x${HD}xf32>) outs(%o0 : tensor<${T}x${HKV}x${G}x${HD}xf32>) {
    ^bb0(%a: f32, %b: f32, %acc: f32):
      %m = arith.mulf %a, %b : f32
      %r = arith.addf %acc, %m : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}x${HD}xf32>
  %y = tensor.collapse_shape %on [[0], [1, 2, 3]] : tensor<${T}x${HKV}x${G}x${HD}xf32> into tensor<${T}x${HHD}xf32>
  return %y : tensor<${T}x${HHD}xf32>
}
