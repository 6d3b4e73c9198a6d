// Elementwise helpers on [T, D] activations: the residual add and SwiGLU (silu(gate) * up).
func.func private @add_${SUFFIX}(%a: tensor<${T}x${D}xf32>, %b: tensor<${T}x${D}xf32>) -> tensor<${T}x${D}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %a, %c0 : tensor<${T}x${D}xf32>
  %e = tensor.empty(${DYN}) : tensor<${T}x${D}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (t, i)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : tensor<${T}x${D}xf32>, tensor<${T}x${D}xf32>) outs(%e : tensor<${T}x${D}xf32>) {
    ^bb0(%x: f32, %y: f32, %o: f32):
      %s = arith.addf %x, %y : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${D}xf32>
  return %r : tensor<${T}x${D}xf32>
}
func.func private @swiglu_${SUFFIX}(%g: tensor<${T}x${D}xf32>, %u: tensor<${T}x${D}xf32>) -> tensor<${T}x${D}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %g, %c0 : tensor<${T}x${D}xf32>
  %e = tensor.empty(${DYN}) : tensor<${T}x${D}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (t, i)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%g, %u : tensor<${T}x${D}xf32>, tensor<${T}x${D}xf32>) outs(%e : tensor<${T}x${D}xf32>) {
    ^bb0(%x: f32, %y: f32, %o: f32):
      %n = arith.negf %x : f32
      %ex = math.exp %n : f32
      %one = arith.constant 1.0 : f32
      %d = arith.addf %one, %ex : f32
      %sg = arith.divf %x, %d : f32
      %s = arith.mulf %sg, %y : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${D}xf32>
  return %r : tensor<${T}x${D}xf32>
}
