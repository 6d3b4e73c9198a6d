// Causal grouped-query attention of T new tokens at positions start + t, with a sliding window
// (gemma3's local layers; WINDOW is huge elsewhere) and a given query scale. Keys come in two
// parts: the cached rows (k_old/v_old [S, HKV, HD], gathered from the slab by slot; rows s >= start
// are padding, since an empty gather cannot be dispatched on Vulkan) and this step's rows
// (k_new/v_new [T, HKV, HD]), so the slab is only written once per step, after all reads.
// q [T, H*HD] with H = HKV * G query heads. Query t (position start + t) sees key position p
// only if p <= start + t and start + t - p < WINDOW. Softmax in f32 with the max subtracted,
// accumulated over both parts.
func.func private @${NAME}(%q: tensor<${T}x${HHD}xf32>, %ko: tensor<?x${HKV}x${HD}xf32>, %vo: tensor<?x${HKV}x${HD}xf32>,
                           %kn: tensor<${T}x${HKV}x${HD}xf32>, %vn: tensor<${T}x${HKV}x${HD}xf32>,
                           %start: index) -> tensor<${T}x${HHD}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %q, %c0 : tensor<${T}x${HHD}xf32>
  %S = tensor.dim %ko, %c0 : tensor<?x${HKV}x${HD}xf32>
  %z = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %scale = arith.constant ${SCALE} : f32
  %qg = tensor.expand_shape %q [[0], [1, 2, 3]] output_shape [${TV}, ${HKV}, ${G}, ${HD}]
      : tensor<${T}x${HHD}xf32> into tensor<${T}x${HKV}x${G}x${HD}xf32>
  // scores against the cached rows: [HKV, G, T, S]
  %eso = tensor.empty(${DYN_S}) : tensor<${HKV}x${G}x${T}x?xf32>
  %so0 = linalg.fill ins(%z : f32) outs(%eso : tensor<${HKV}x${G}x${T}x?xf32>) -> tensor<${HKV}x${G}x${T}x?xf32>
  %so = linalg.generic {indexing_maps = [affine_map<(g, r, t, s, d) -> (t, g, r, d)>,
        affine_map<(g, r, t, s, d) -> (s, g, d)>, affine_map<(g, r, t, s, d) -> (g, r, t, s)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%qg, %ko : tensor<${T}x${HKV}x${G}x${HD}xf32>, tensor<?x${HKV}x${HD}xf32>) outs(%so0 : tensor<${HKV}x${G}x${T}x?xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %m = arith.mulf %a, %b : f32
      %r = arith.addf %o, %m : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}x?xf32>
  // key s is visible to query t when it is cached (s < start) and start + t - s < WINDOW
  %som = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t, s)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%so : tensor<${HKV}x${G}x${T}x?xf32>) outs(%eso : tensor<${HKV}x${G}x${T}x?xf32>) {
    ^bb0(%a: f32, %o: f32):
      %t = linalg.index 2 : index
      %s = linalg.index 3 : index
      %qp = arith.addi %start, %t : index
      %d = arith.subi %qp, %s : index
      %w = arith.constant ${WINDOW} : index
      %near = arith.cmpi ult, %d, %w : index
      %cached = arith.cmpi ult, %s, %start : index
      %ok = arith.andi %near, %cached : i1
      %r = arith.select %ok, %a, %ninf : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}x?xf32>
  // scores against this step's rows: [HKV, G, T, T], causal
  %esn = tensor.empty(${DYN_TT}) : tensor<${HKV}x${G}x${T}x${T}xf32>
  %sn0 = linalg.fill ins(%z : f32) outs(%esn : tensor<${HKV}x${G}x${T}x${T}xf32>) -> tensor<${HKV}x${G}x${T}x${T}xf32>
  %snr = linalg.generic {indexing_maps = [affine_map<(g, r, t, s, d) -> (t, g, r, d)>,
        affine_map<(g, r, t, s, d) -> (s, g, d)>, affine_map<(g, r, t, s, d) -> (g, r, t, s)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%qg, %kn : tensor<${T}x${HKV}x${G}x${HD}xf32>, tensor<${T}x${HKV}x${HD}xf32>) outs(%sn0 : tensor<${HKV}x${G}x${T}x${T}xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %m = arith.mulf %a, %b : f32
      %r = arith.addf %o, %m : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}x${T}xf32>
  %sn = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t, s)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%snr : tensor<${HKV}x${G}x${T}x${T}xf32>) outs(%esn : tensor<${HKV}x${G}x${T}x${T}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %t = linalg.index 2 : index
      %s = linalg.index 3 : index
      %causal = arith.cmpi ule, %s, %t : index
      %d = arith.subi %t, %s : index
      %w = arith.constant ${WINDOW} : index
      %near = arith.cmpi ult, %d, %w : index
      %ok = arith.andi %causal, %near : i1
      %r = arith.select %ok, %a, %ninf : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}x${T}xf32>
  // running max, exp, sum over both parts
  %em = tensor.empty(${DYN}) : tensor<${HKV}x${G}x${T}xf32>
  %m0 = linalg.fill ins(%ninf : f32) outs(%em : tensor<${HKV}x${G}x${T}xf32>) -> tensor<${HKV}x${G}x${T}xf32>
  %mo = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%som : tensor<${HKV}x${G}x${T}x?xf32>) outs(%m0 : tensor<${HKV}x${G}x${T}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.maximumf %a, %o : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}xf32>
  %m1 = linalg.fill ins(%ninf : f32) outs(%em : tensor<${HKV}x${G}x${T}xf32>) -> tensor<${HKV}x${G}x${T}xf32>
  %mn = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%sn : tensor<${HKV}x${G}x${T}x${T}xf32>) outs(%m1 : tensor<${HKV}x${G}x${T}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.maximumf %a, %o : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}xf32>
  // (separate reductions joined elementwise: IREE rejects a reduction chained onto another's result)
  %mx = linalg.generic {indexing_maps = [affine_map<(g, r, t) -> (g, r, t)>, affine_map<(g, r, t) -> (g, r, t)>,
        affine_map<(g, r, t) -> (g, r, t)>], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%mo, %mn : tensor<${HKV}x${G}x${T}xf32>, tensor<${HKV}x${G}x${T}xf32>) outs(%em : tensor<${HKV}x${G}x${T}xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %r = arith.maximumf %a, %b : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}xf32>
  %po = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t)>,
        affine_map<(g, r, t, s) -> (g, r, t, s)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%som, %mx : tensor<${HKV}x${G}x${T}x?xf32>, tensor<${HKV}x${G}x${T}xf32>) outs(%eso : tensor<${HKV}x${G}x${T}x?xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %d = arith.subf %a, %b : f32
      %sd = arith.mulf %d, %scale : f32
      %r = math.exp %sd : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}x?xf32>
  %pn = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t)>,
        affine_map<(g, r, t, s) -> (g, r, t, s)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%sn, %mx : tensor<${HKV}x${G}x${T}x${T}xf32>, tensor<${HKV}x${G}x${T}xf32>) outs(%esn : tensor<${HKV}x${G}x${T}x${T}xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %d = arith.subf %a, %b : f32
      %sd = arith.mulf %d, %scale : f32
      %r = math.exp %sd : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}x${T}xf32>
  %l0 = linalg.fill ins(%z : f32) outs(%em : tensor<${HKV}x${G}x${T}xf32>) -> tensor<${HKV}x${G}x${T}xf32>
  %lo = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%po : tensor<${HKV}x${G}x${T}x?xf32>) outs(%l0 : tensor<${HKV}x${G}x${T}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.addf %a, %o : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}xf32>
  %l1 = linalg.fill ins(%z : f32) outs(%em : tensor<${HKV}x${G}x${T}xf32>) -> tensor<${HKV}x${G}x${T}xf32>
  %ln = linalg.generic {indexing_maps = [affine_map<(g, r, t, s) -> (g, r, t, s)>, affine_map<(g, r, t, s) -> (g, r, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%pn : tensor<${HKV}x${G}x${T}x${T}xf32>) outs(%l1 : tensor<${HKV}x${G}x${T}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.addf %a, %o : f32
      linalg.yield %r : f32
  } -> tensor<${HKV}x${G}x${T}xf32>
  // weighted sum of values over both parts: [T, HKV, G, HD]
  %eo = tensor.empty(${DYN}) : tensor<${T}x${HKV}x${G}x${HD}xf32>
  %o0 = linalg.fill ins(%z : f32) outs(%eo : tensor<${T}x${HKV}x${G}x${HD}xf32>) -> tensor<${T}x${HKV}x${G}x${HD}xf32>
  %pvo = linalg.generic {indexing_maps = [affine_map<(t, g, r, d, s) -> (g, r, t, s)>,
        affine_map<(t, g, r, d, s) -> (s, g, d)>, affine_map<(t, g, r, d, s) -> (t, g, r, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%po, %vo : tensor<${HKV}x${G}x${T}x?xf32>, tensor<?x${HKV}x${HD}xf32>) outs(%o0 : tensor<${T}x${HKV}x${G}x${HD}xf32>) {
    ^bb0(%a: f32, %b: f32, %acc: f32):
      %m = arith.mulf %a, %b : f32
      %r = arith.addf %acc, %m : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}x${HD}xf32>
  %o1 = linalg.fill ins(%z : f32) outs(%eo : tensor<${T}x${HKV}x${G}x${HD}xf32>) -> tensor<${T}x${HKV}x${G}x${HD}xf32>
  %pvn = linalg.generic {indexing_maps = [affine_map<(t, g, r, d, s) -> (g, r, t, s)>,
        affine_map<(t, g, r, d, s) -> (s, g, d)>, affine_map<(t, g, r, d, s) -> (t, g, r, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%pn, %vn : tensor<${HKV}x${G}x${T}x${T}xf32>, tensor<${T}x${HKV}x${HD}xf32>) outs(%o1 : tensor<${T}x${HKV}x${G}x${HD}xf32>) {
    ^bb0(%a: f32, %b: f32, %acc: f32):
      %m = arith.mulf %a, %b : f32
      %r = arith.addf %acc, %m : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}x${HD}xf32>
  %on = linalg.generic {indexing_maps = [affine_map<(t, g, r, d) -> (t, g, r, d)>, affine_map<(t, g, r, d) -> (t, g, r, d)>,
        affine_map<(t, g, r, d) -> (g, r, t)>, affine_map<(t, g, r, d) -> (g, r, t)>, affine_map<(t, g, r, d) -> (t, g, r, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%pvo, %pvn, %lo, %ln : tensor<${T}x${HKV}x${G}x${HD}xf32>, tensor<${T}x${HKV}x${G}x${HD}xf32>,
          tensor<${HKV}x${G}x${T}xf32>, tensor<${HKV}x${G}x${T}xf32>) outs(%eo : tensor<${T}x${HKV}x${G}x${HD}xf32>) {
    ^bb0(%a: f32, %a2: f32, %b: f32, %b2: f32, %o: f32):
      %num = arith.addf %a, %a2 : f32
      %den = arith.addf %b, %b2 : f32
      %r = arith.divf %num, %den : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}x${HD}xf32>
  %y = tensor.collapse_shape %on [[0], [1, 2, 3]] : tensor<${T}x${HKV}x${G}x${HD}xf32> into tensor<${T}x${HHD}xf32>
  return %y : tensor<${T}x${HHD}xf32>
}
