// RMSNorm over rows: y[t, i] = x[t, i] / sqrt(mean_i(x[t, :]^2) + eps) * w[i].
func.func private @${NAME}(%x: tensor<${T}x${D}xf32>, %w: tensor<${D}xf32>) -> tensor<${T}x${D}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${D}xf32>
  %z = arith.constant 0.0 : f32
  %e0 = tensor.empty(${DYN}) : tensor<${T}xf32>
  %a0 = linalg.fill ins(%z : f32) outs(%e0 : tensor<${T}xf32>) -> tensor<${T}xf32>
  %ss = linalg.generic {indexing_maps = [affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (t)>],
      iterator_types = ["parallel", "reduction"]} ins(%x : tensor<${T}x${D}xf32>) outs(%a0 : tensor<${T}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %m = arith.mulf %a, %a : f32
      %s = arith.addf %o, %m : f32
      linalg.yield %s : f32
  } -> tensor<${T}xf32>
  %e = tensor.empty(${DYN}) : tensor<${T}x${D}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (i)>,
        affine_map<(t, i) -> (t)>, affine_map<(t, i) -> (t, i)>], iterator_types = ["parallel", "parallel"]}
      ins(%x, %w, %ss : tensor<${T}x${D}xf32>, tensor<${D}xf32>, tensor<${T}xf32>) outs(%e : tensor<${T}x${D}xf32>) {
    ^bb0(%a: f32, %b: f32, %s: f32, %o: f32):
      %n = arith.constant ${DF} : f32
      %eps = arith.constant ${EPS} : f32
      %mean = arith.divf %s, %n : f32
      %v = arith.addf %mean, %eps : f32
      %rs = math.rsqrt %v : f32
      %t = arith.mulf %a, %rs : f32
      %y = arith.mulf %t, %b : f32
      linalg.yield %y : f32
  } -> tensor<${T}x${D}xf32>
  return %r : tensor<${T}x${D}xf32>
}
