// A projection's bias (qwen2's attn_q/k/v.bias): y[t, i] = x[t, i] + b[i].
func.func private @bias_${SUFFIX}(%x: tensor<${T}x${D}xf32>, %b: tensor<${D}xf32>) -> tensor<${T}x${D}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${D}xf32>
  %e = tensor.empty(${DYN}) : tensor<${T}x${D}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (i)>, affine_map<(t, i) -> (t, i)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%x, %b : tensor<${T}x${D}xf32>, tensor<${D}xf32>) outs(%e : tensor<${T}x${D}xf32>) {
    ^bb0(%a: f32, %c: f32, %o: f32):
      %s = arith.addf %a, %c : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${D}xf32>
  return %r : tensor<${T}x${D}xf32>
}
