// y[t, n] = sum_k x[t, k] * W[n, k], W a BF16 GGUF tensor [N, K] bound as its raw bytes [N, K, 2]:
// f32 bits = hi << 24 | lo << 16, assembled with integer ops (bytes, as for F16).
// Placeholders: NAME, T, TV, DYN, N, K, BF16_W (fragment: %lo, %hi -> %wv).
func.func private @${NAME}(%w: tensor<${N}x${K}x2xi8>, %x: tensor<${T}x${K}xf32>) -> tensor<${T}x${N}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${K}xf32>
  %wl = tensor.extract_slice %w[0, 0, 0] [${N}, ${K}, 1] [1, 1, 1] : tensor<${N}x${K}x2xi8> to tensor<${N}x${K}xi8>
  %wh = tensor.extract_slice %w[0, 0, 1] [${N}, ${K}, 1] [1, 1, 1] : tensor<${N}x${K}x2xi8> to tensor<${N}x${K}xi8>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(${DYN}) : tensor<${T}x${N}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<${T}x${N}xf32>) -> tensor<${T}x${N}xf32>
  %y = linalg.generic {indexing_maps = [
        affine_map<(t, n, k) -> (n, k)>, affine_map<(t, n, k) -> (n, k)>, affine_map<(t, n, k) -> (t, k)>,
        affine_map<(t, n, k) -> (t, n)>],
      iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%wl, %wh, %x : tensor<${N}x${K}xi8>, tensor<${N}x${K}xi8>, tensor<${T}x${K}xf32>) outs(%acc : tensor<${T}x${N}xf32>) {
    ^bb0(%lo: i8, %hi: i8, %xv: f32, %a: f32):
${BF16_W}
      %p = arith.mulf %wv, %xv : f32
      %s = arith.addf %a, %p : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${N}xf32>
  return %y : tensor<${T}x${N}xf32>
}
