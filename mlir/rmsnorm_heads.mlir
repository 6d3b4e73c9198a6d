// RMSNorm of every head (QK-norm of qwen3 and gemma3): x [T, H*HD] viewed as [T, H, HD],
// y[t, h, i] = x[t, h, i] / sqrt(mean_i(x[t, h, :]^2) + eps) * w[i], one weight shared by the heads.
func.func private @${NAME}(%x: tensor<${T}x${HHD}xf32>, %w: tensor<${HD}xf32>) -> tensor<${T}x${HHD}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${HHD}xf32>
  %z = arith.constant 0.0 : f32
  %xr = tensor.expand_shape %x [[0], [1, 2]] output_shape [${TV}, ${H}, ${HD}]
      : tensor<${T}x${HHD}xf32> into tensor<${T}x${H}x${HD}xf32>
  %e0 = tensor.empty(${DYN}) : tensor<${T}x${H}xf32>
  %a0 = linalg.fill ins(%z : f32) outs(%e0 : tensor<${T}x${H}xf32>) -> tensor<${T}x${H}xf32>
  %ss = linalg.generic {indexing_maps = [affine_map<(t, h, i) -> (t, h, i)>, affine_map<(t, h, i) -> (t, h)>],
      iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%xr : tensor<${T}x${H}x${HD}xf32>) outs(%a0 : tensor<${T}x${H}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %m = arith.mulf %a, %a : f32
      %s = arith.addf %o, %m : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${H}xf32>
  %e = tensor.empty(${DYN}) : tensor<${T}x${H}x${HD}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(t, h, i) -> (t, h, i)>, affine_map<(t, h, i) -> (i)>,
        affine_map<(t, h, i) -> (t, h)>, affine_map<(t, h, i) -> (t, h, i)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%xr, %w, %ss : tensor<${T}x${H}x${HD}xf32>, tensor<${HD}xf32>, tensor<${T}x${H}xf32>)
      outs(%e : tensor<${T}x${H}x${HD}xf32>) {
    ^bb0(%a: f32, %b: f32, %s: f32, %o: f32):
      %n = arith.constant ${HDF} : f32
      %eps = arith.constant ${EPS} : f32
      %mean = arith.divf %s, %n : f32
      %v = arith.addf %mean, %eps : f32
      %rs = math.rsqrt %v : f32
      %t = arith.mulf %a, %rs : f32
      %y = arith.mulf %t, %b : f32
      linalg.yield %y : f32
  } -> tensor<${T}x${H}x${HD}xf32>
  %y = tensor.collapse_shape %r [[0], [1, 2]] : tensor<${T}x${H}x${HD}xf32> into tensor<${T}x${HHD}xf32>
  return %y : tensor<${T}x${HHD}xf32>
}
