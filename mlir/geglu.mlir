// The GELU-gated product of gemma3's feed-forward: gelu(gate) * up, with GELU's tanh form
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as llama.cpp's ggml_gelu.
func.func private @geglu_${SUFFIX}(%g: tensor<${T}x${D}xf32>, %u: tensor<${T}x${D}xf32>) -> tensor<${T}x${D}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %g, %c0 : tensor<${T}x${D}xf32>
  %e = tensor.empty(${DYN}) : tensor<${T}x${D}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (t, i)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%g, %u : tensor<${T}x${D}xf32>, tensor<${T}x${D}xf32>) outs(%e : tensor<${T}x${D}xf32>) {
    ^bb0(%x: f32, %y: f32, %o: f32):
      %c = arith.constant 0.7978845608028654 : f32
      %k = arith.constant 0.044715 : f32
      %half = arith.constant 0.5 : f32
      %one = arith.constant 1.0 : f32
      %x2 = arith.mulf %x, %x : f32
      %x3 = arith.mulf %x2, %x : f32
      %kx3 = arith.mulf %k, %x3 : f32
      %in = arith.addf %x, %kx3 : f32
      %arg = arith.mulf %c, %in : f32
      %th = math.tanh %arg : f32
      %opt = arith.addf %one, %th : f32
      %hx = arith.mulf %half, %x : f32
      %gl = arith.mulf %hx, %opt : f32
      %s = arith.mulf %gl, %y : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${D}xf32>
  return %r : tensor<${T}x${D}xf32>
}
