// y[t, n] = sum_k x[t, k] * W[n, k], W an F32 GGUF tensor [N, K].
func.func private @${NAME}(%w: tensor<${N}x${K}xf32>, %x: tensor<${T}x${K}xf32>) -> tensor<${T}x${N}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${K}xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(${DYN}) : tensor<${T}x${N}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<${T}x${N}xf32>) -> tensor<${T}x${N}xf32>
  %y = linalg.generic {indexing_maps = [
        affine_map<(t, n, k) -> (n, k)>, affine_map<(t, n, k) -> (t, k)>, affine_map<(t, n, k) -> (t, n)>],
      iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%w, %x : tensor<${N}x${K}xf32>, tensor<${T}x${K}xf32>) outs(%acc : tensor<${T}x${N}xf32>) {
    ^bb0(%wv: f32, %xv: f32, %a: f32):
      %p = arith.mulf %wv, %xv : f32
      %s = arith.addf %a, %p : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${N}xf32>
  return %y : tensor<${T}x${N}xf32>
}
