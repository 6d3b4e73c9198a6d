// Multiplication by a constant (gemma3's embedding scale sqrt(n_embd)): y = x * S.
func.func private @${NAME}(%x: tensor<${T}x${D}xf32>) -> tensor<${T}x${D}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${D}xf32>
  %e = tensor.empty(${DYN}) : tensor<${T}x${D}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (t, i)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<${T}x${D}xf32>) outs(%e : tensor<${T}x${D}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %s = arith.constant ${S} : f32
      %y = arith.mulf %a, %s : f32
      linalg.yield %y : f32
  } -> tensor<${T}x${D}xf32>
  return %r : tensor<${T}x${D}xf32>
}
