// Final logit softcapping: y = CAP * tanh(x / CAP).
func.func private @${NAME}(%x: tensor<${T}x${D}xf32>) -> tensor<${T}x${D}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${D}xf32>
  %e = tensor.empty(${DYN}) : tensor<${T}x${D}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (t, i)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<${T}x${D}xf32>) outs(%e : tensor<${T}x${D}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %inv = arith.constant ${INV_CAP} : f32
      %cap = arith.constant ${CAP} : f32
      %s = arith.mulf %a, %inv : f32
      %th = math.tanh %s : f32
      %y = arith.mulf %th, %cap : f32
      linalg.yield %y : f32
  } -> tensor<${T}x${D}xf32>
  return %r : tensor<${T}x${D}xf32>
}
