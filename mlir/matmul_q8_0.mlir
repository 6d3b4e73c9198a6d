// y[t, n] = sum_k x[t, k] * W[n, k], W in GGUF Q8_0 blocks read raw from the parameter:
// 34 bytes per 32 weights = f16 scale d (little-endian bytes 0-1), then 32 x int8 q; w = d * q.
// Placeholders: NAME, T (1 or ?), TV (1 or %T), DYN ("" or %T), N, K, B = K/32, F16_D (fragment: %lo, %hi -> %d).
func.func private @${NAME}(%w: tensor<${N}x${B}x34xi8>, %x: tensor<${T}x${K}xf32>) -> tensor<${T}x${N}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${K}xf32>
  %qs = tensor.extract_slice %w[0, 0, 2] [${N}, ${B}, 32] [1, 1, 1] : tensor<${N}x${B}x34xi8> to tensor<${N}x${B}x32xi8>
  %dl = tensor.extract_slice %w[0, 0, 0] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x34xi8> to tensor<${N}x${B}xi8>
  %dh = tensor.extract_slice %w[0, 0, 1] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x34xi8> to tensor<${N}x${B}xi8>
  %xb = tensor.expand_shape %x [[0], [1, 2]] output_shape [${TV}, ${B}, 32] : tensor<${T}x${K}xf32> into tensor<${T}x${B}x32xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(${DYN}) : tensor<${T}x${N}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<${T}x${N}xf32>) -> tensor<${T}x${N}xf32>
  %y = linalg.generic {indexing_maps = [
        affine_map<(t, n, b, j) -> (n, b, j)>, affine_map<(t, n, b, j) -> (n, b)>,
        affine_map<(t, n, b, j) -> (n, b)>, affine_map<(t, n, b, j) -> (t, b, j)>,
        affine_map<(t, n, b, j) -> (t, n)>],
      iterator_types = ["parallel", "parallel", "reduction", "reduction"]}
      ins(%qs, %dl, %dh, %xb : tensor<${N}x${B}x32xi8>, tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>, tensor<${T}x${B}x32xf32>)
      outs(%acc : tensor<${T}x${N}xf32>) {
    ^bb0(%q: i8, %lo: i8, %hi: i8, %xv: f32, %a: f32):
${F16_D}
      %qf = arith.sitofp %q : i8 to f32
      %wv = arith.mulf %qf, %d : f32
      %p = arith.mulf %wv, %xv : f32
      %s = arith.addf %a, %p : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${N}xf32>
  return %y : tensor<${T}x${N}xf32>
}
