// y[t, n] = sum_k x[t, k] * W[n, k], W in GGUF Q4_1 blocks read raw from the parameter:
// 20 bytes per 32 weights = f16 d, f16 m, 16 bytes of nibbles; element j < 16 is the low nibble of
// byte j, element 16 + j the high nibble; w = d * q + m. Loop dims (t, n, b, h, j): k = 32b + 16h + j.
// Placeholders: as matmul_q8_0.mlir, plus F16_M (fragment: %mlo, %mhi -> %m).
func.func private @${NAME}(%w: tensor<${N}x${B}x20xi8>, %x: tensor<${T}x${K}xf32>) -> tensor<${T}x${N}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${K}xf32>
  %qs = tensor.extract_slice %w[0, 0, 4] [${N}, ${B}, 16] [1, 1, 1] : tensor<${N}x${B}x20xi8> to tensor<${N}x${B}x16xi8>
  %dl = tensor.extract_slice %w[0, 0, 0] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x20xi8> to tensor<${N}x${B}xi8>
  %dh = tensor.extract_slice %w[0, 0, 1] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x20xi8> to tensor<${N}x${B}xi8>
  %ml = tensor.extract_slice %w[0, 0, 2] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x20xi8> to tensor<${N}x${B}xi8>
  %mh = tensor.extract_slice %w[0, 0, 3] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x20xi8> to tensor<${N}x${B}xi8>
  %xb = tensor.expand_shape %x [[0], [1, 2, 3]] output_shape [${TV}, ${B}, 2, 16] : tensor<${T}x${K}xf32> into tensor<${T}x${B}x2x16xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(${DYN}) : tensor<${T}x${N}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<${T}x${N}xf32>) -> tensor<${T}x${N}xf32>
  %y = linalg.generic {indexing_maps = [
        affine_map<(t, n, b, h, j) -> (n, b, j)>, affine_map<(t, n, b, h, j) -> (n, b)>,
        affine_map<(t, n, b, h, j) -> (n, b)>, affine_map<(t, n, b, h, j) -> (n, b)>,
        affine_map<(t, n, b, h, j) -> (n, b)>, affine_map<(t, n, b, h, j) -> (t, b, h, j)>,
        affine_map<(t, n, b, h, j) -> (t, n)>],
      iterator_types = ["parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%qs, %dl, %dh, %ml, %mh, %xb : tensor<${N}x${B}x16xi8>, tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>,
          tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>, tensor<${T}x${B}x2x16xf32>)
      outs(%acc : tensor<${T}x${N}xf32>) {
    ^bb0(%q: i8, %lo: i8, %hi: i8, %mlo: i8, %mhi: i8, %xv: f32, %a: f32):
${F16_D}
${F16_M}
      %h = linalg.index 3 : index
      %hi8 = arith.index_cast %h : index to i8
      %c4 = arith.constant 4 : i8
      %sh = arith.muli %hi8, %c4 : i8
      %qsh = arith.shrui %q, %sh : i8
      %c15 = arith.constant 15 : i8
      %qn = arith.andi %qsh, %c15 : i8
      %qf = arith.uitofp %qn : i8 to f32
      %wd = arith.mulf %qf, %d : f32
      %wv = arith.addf %wd, %m : f32
      %p = arith.mulf %wv, %xv : f32
      %s = arith.addf %a, %p : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${N}xf32>
  return %y : tensor<${T}x${N}xf32>
}
