// Attention for a batch of sequences, one new token each (batched decode). Row t is its own
// sequence: query q[t] at position len[t] sees its cached rows, read straight from the slot-major
// slab cache[ctx[t, s], layer] for s < len[t] (ctx holds the slots of its positions; entries past
// len[t] are padding), and its own new row kn[t]/vn[t]. Reading the slab inside the score and
// value products saves a gathered copy per layer. Keys further back than WINDOW positions are
// masked (sliding-window layers). Softmax in f32 with the max subtracted, accumulated over both
// parts; SCALE multiplies the scores. SLAB: the slab's type; READ_K/READ_V load its value
// (%si, %layer, part, %gi, %di) into f32 %b (zinc.compiler.paged.slab_read: f16x2 unpacks a half
// of an i32 word).
func.func private @${NAME}(%q: tensor<${T}x${HHD}xf32>, %cache: ${SLAB}, %ctx: tensor<${T}x?xi32>,
                           %layer: index, %kn: tensor<${T}x${HKV}x${HD}xf32>, %vn: tensor<${T}x${HKV}x${HD}xf32>,
                           %len: tensor<${T}xi32>) -> tensor<${T}x${HHD}xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %T = tensor.dim %q, %c0 : tensor<${T}x${HHD}xf32>
  %S = tensor.dim %ctx, %c1 : tensor<${T}x?xi32>
  %part_k = arith.constant 0 : index
  %part_v = arith.constant 1 : index
  %z = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %scale = arith.constant ${SCALE} : f32
  %qg = tensor.expand_shape %q [[0], [1, 2, 3]] output_shape [${TV}, ${HKV}, ${G}, ${HD}]
      : tensor<${T}x${HHD}xf32> into tensor<${T}x${HKV}x${G}x${HD}xf32>
  // scores against the cached rows [T, HKV, G, S], masked past len and outside the window
  %eso = tensor.empty(${DYN_S}) : tensor<${T}x${HKV}x${G}x?xf32>
  %so0 = linalg.fill ins(%z : f32) outs(%eso : tensor<${T}x${HKV}x${G}x?xf32>) -> tensor<${T}x${HKV}x${G}x?xf32>
  %sor = linalg.generic {indexing_maps = [affine_map<(t, g, r, s, d) -> (t, g, r, d)>,
        affine_map<(t, g, r, s, d) -> (t, s)>, affine_map<(t, g, r, s, d) -> (t, g, r, s)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%qg, %ctx : tensor<${T}x${HKV}x${G}x${HD}xf32>, tensor<${T}x?xi32>) outs(%so0 : tensor<${T}x${HKV}x${G}x?xf32>) {
    ^bb0(%a: f32, %slot: i32, %o: f32):
      %gi = linalg.index 1 : index
      %di = linalg.index 4 : index
      %si = arith.index_cast %slot : i32 to index
      ${READ_K}
      %m = arith.mulf %a, %b : f32
      %r = arith.addf %o, %m : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}x?xf32>
  %so = linalg.generic {indexing_maps = [affine_map<(t, g, r, s) -> (t, g, r, s)>, affine_map<(t, g, r, s) -> (t)>,
        affine_map<(t, g, r, s) -> (t, g, r, s)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%sor, %len : tensor<${T}x${HKV}x${G}x?xf32>, tensor<${T}xi32>) outs(%eso : tensor<${T}x${HKV}x${G}x?xf32>) {
    ^bb0(%a: f32, %n: i32, %o: f32):
      %s = linalg.index 3 : index
      %ni = arith.index_cast %n : i32 to index
      %inside = arith.cmpi ult, %s, %ni : index
      %d = arith.subi %ni, %s : index
      %w = arith.constant ${WINDOW} : index
      %near = arith.cmpi ult, %d, %w : index
      %ok = arith.andi %inside, %near : i1
      %r = arith.select %ok, %a, %ninf : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}x?xf32>
  // score against the row's own new key [T, HKV, G]
  %em = tensor.empty(${DYN}) : tensor<${T}x${HKV}x${G}xf32>
  %sn0 = linalg.fill ins(%z : f32) outs(%em : tensor<${T}x${HKV}x${G}xf32>) -> tensor<${T}x${HKV}x${G}xf32>
  %sn = linalg.generic {indexing_maps = [affine_map<(t, g, r, d) -> (t, g, r, d)>, affine_map<(t, g, r, d) -> (t, g, d)>,
        affine_map<(t, g, r, d) -> (t, g, r)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%qg, %kn : tensor<${T}x${HKV}x${G}x${HD}xf32>, tensor<${T}x${HKV}x${HD}xf32>) outs(%sn0 : tensor<${T}x${HKV}x${G}xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %m = arith.mulf %a, %b : f32
      %r = arith.addf %o, %m : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}xf32>
  %m0 = linalg.fill ins(%ninf : f32) outs(%em : tensor<${T}x${HKV}x${G}xf32>) -> tensor<${T}x${HKV}x${G}xf32>
  %mo = linalg.generic {indexing_maps = [affine_map<(t, g, r, s) -> (t, g, r, s)>, affine_map<(t, g, r, s) -> (t, g, r)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%so : tensor<${T}x${HKV}x${G}x?xf32>) outs(%m0 : tensor<${T}x${HKV}x${G}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.maximumf %a, %o : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}xf32>
  // the new key is never masked, so the max and the denominator are finite
  %mx = linalg.generic {indexing_maps = [affine_map<(t, g, r) -> (t, g, r)>, affine_map<(t, g, r) -> (t, g, r)>,
        affine_map<(t, g, r) -> (t, g, r)>], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%mo, %sn : tensor<${T}x${HKV}x${G}xf32>, tensor<${T}x${HKV}x${G}xf32>) outs(%em : tensor<${T}x${HKV}x${G}xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %r = arith.maximumf %a, %b : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}xf32>
  %po = linalg.generic {indexing_maps = [affine_map<(t, g, r, s) -> (t, g, r, s)>, affine_map<(t, g, r, s) -> (t, g, r)>,
        affine_map<(t, g, r, s) -> (t, g, r, s)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%so, %mx : tensor<${T}x${HKV}x${G}x?xf32>, tensor<${T}x${HKV}x${G}xf32>) outs(%eso : tensor<${T}x${HKV}x${G}x?xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %d = arith.subf %a, %b : f32
      %sd = arith.mulf %d, %scale : f32
      %r = math.exp %sd : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}x?xf32>
  %l0 = linalg.fill ins(%z : f32) outs(%em : tensor<${T}x${HKV}x${G}xf32>) -> tensor<${T}x${HKV}x${G}xf32>
  %lo = linalg.generic {indexing_maps = [affine_map<(t, g, r, s) -> (t, g, r, s)>, affine_map<(t, g, r, s) -> (t, g, r)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%po : tensor<${T}x${HKV}x${G}x?xf32>) outs(%l0 : tensor<${T}x${HKV}x${G}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.addf %a, %o : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}xf32>
  // weighted sum of the cached values [T, HKV, G, HD]
  %eo = tensor.empty(${DYN}) : tensor<${T}x${HKV}x${G}x${HD}xf32>
  %o0 = linalg.fill ins(%z : f32) outs(%eo : tensor<${T}x${HKV}x${G}x${HD}xf32>) -> tensor<${T}x${HKV}x${G}x${HD}xf32>
  %pvo = linalg.generic {indexing_maps = [affine_map<(t, g, r, d, s) -> (t, g, r, s)>,
        affine_map<(t, g, r, d, s) -> (t, s)>, affine_map<(t, g, r, d, s) -> (t, g, r, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%po, %ctx : tensor<${T}x${HKV}x${G}x?xf32>, tensor<${T}x?xi32>) outs(%o0 : tensor<${T}x${HKV}x${G}x${HD}xf32>) {
    ^bb0(%a: f32, %slot: i32, %acc: f32):
      %gi = linalg.index 1 : index
      %di = linalg.index 3 : index
      %si = arith.index_cast %slot : i32 to index
      ${READ_V}
      %m = arith.mulf %a, %b : f32
      %r = arith.addf %acc, %m : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}x${HD}xf32>
  // plus the new row's value, over both denominators
  %on = linalg.generic {indexing_maps = [affine_map<(t, g, r, d) -> (t, g, r, d)>, affine_map<(t, g, r, d) -> (t, g, r)>,
        affine_map<(t, g, r, d) -> (t, g, r)>, affine_map<(t, g, r, d) -> (t, g, r)>, affine_map<(t, g, r, d) -> (t, g, d)>,
        affine_map<(t, g, r, d) -> (t, g, r, d)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%pvo, %sn, %mx, %lo, %vn : tensor<${T}x${HKV}x${G}x${HD}xf32>, tensor<${T}x${HKV}x${G}xf32>, tensor<${T}x${HKV}x${G}xf32>,
          tensor<${T}x${HKV}x${G}xf32>, tensor<${T}x${HKV}x${HD}xf32>) outs(%eo : tensor<${T}x${HKV}x${G}x${HD}xf32>) {
    ^bb0(%a: f32, %s: f32, %m: f32, %l: f32, %v: f32, %o: f32):
      %d = arith.subf %s, %m : f32
      %sd = arith.mulf %d, %scale : f32
      %p = math.exp %sd : f32
      %pv = arith.mulf %p, %v : f32
      %num = arith.addf %a, %pv : f32
      %den = arith.addf %l, %p : f32
      %r = arith.divf %num, %den : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${HKV}x${G}x${HD}xf32>
  %y = tensor.collapse_shape %on [[0], [1, 2, 3]] : tensor<${T}x${HKV}x${G}x${HD}xf32> into tensor<${T}x${HHD}xf32>
  return %y : tensor<${T}x${HHD}xf32>
}
