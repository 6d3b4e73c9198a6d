// y[t, n] = sum_k x[t, k] * W[n, k], W in GGUF Q5_0 blocks read raw from the parameter:
// 22 bytes per 32 weights = f16 d (bytes 0-1), 32 high bits qh (bytes 2-5, a little-endian u32),
// 16 bytes of low nibbles (6-21). Element j < 16 is the low nibble of byte j, element 16 + j the
// high nibble; bit e of qh is bit 4 of element e; w = d * (q - 16).
// Loop dims (t, n, b, h, j): k = 32b + 16h + j, e = 16h + j.
// Placeholders: as matmul_q8_0.mlir.
func.func private @${NAME}(%w: tensor<${N}x${B}x22xi8>, %x: tensor<${T}x${K}xf32>) -> tensor<${T}x${N}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${K}xf32>
  %qs = tensor.extract_slice %w[0, 0, 6] [${N}, ${B}, 16] [1, 1, 1] : tensor<${N}x${B}x22xi8> to tensor<${N}x${B}x16xi8>
  %dl = tensor.extract_slice %w[0, 0, 0] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x22xi8> to tensor<${N}x${B}xi8>
  %dh = tensor.extract_slice %w[0, 0, 1] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x22xi8> to tensor<${N}x${B}xi8>
  %h0 = tensor.extract_slice %w[0, 0, 2] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x22xi8> to tensor<${N}x${B}xi8>
  %h1 = tensor.extract_slice %w[0, 0, 3] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x22xi8> to tensor<${N}x${B}xi8>
  %h2 = tensor.extract_slice %w[0, 0, 4] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x22xi8> to tensor<${N}x${B}xi8>
  %h3 = tensor.extract_slice %w[0, 0, 5] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x22xi8> to tensor<${N}x${B}xi8>
  %xb = tensor.expand_shape %x [[0], [1, 2, 3]] output_shape [${TV}, ${B}, 2, 16] : tensor<${T}x${K}xf32> into tensor<${T}x${B}x2x16xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(${DYN}) : tensor<${T}x${N}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<${T}x${N}xf32>) -> tensor<${T}x${N}xf32>
  %y = linalg.generic {indexing_maps = [
        affine_map<(t, n, b, h, j) -> (n, b, j)>, affine_map<(t, n, b, h, j) -> (n, b)>,
        affine_map<(t, n, b, h, j) -> (n, b)>, affine_map<(t, n, b, h, j) -> (n, b)>,
        affine_map<(t, n, b, h, j) -> (n, b)>, affine_map<(t, n, b, h, j) -> (n, b)>,
        affine_map<(t, n, b, h, j) -> (n, b)>, affine_map<(t, n, b, h, j) -> (t, b, h, j)>,
        affine_map<(t, n, b, h, j) -> (t, n)>],
      iterator_types = ["parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%qs, %dl, %dh, %h0, %h1, %h2, %h3, %xb : tensor<${N}x${B}x16xi8>, tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>,
          tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>, tensor<${T}x${B}x2x16xf32>)
      outs(%acc : tensor<${T}x${N}xf32>) {
    ^bb0(%q: i8, %lo: i8, %hi: i8, %b0: i8, %b1: i8, %b2: i8, %b3: i8, %xv: f32, %a: f32):
${F16_D}
${QH32}
      %h = linalg.index 3 : index
      %j = linalg.index 4 : index
${Q5}
      %c16 = arith.constant 16 : i32
      %qc = arith.subi %q5, %c16 : i32
      %qf = arith.sitofp %qc : i32 to f32
      %wv = arith.mulf %qf, %d : f32
      %p = arith.mulf %wv, %xv : f32
      %s = arith.addf %a, %p : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${N}xf32>
  return %y : tensor<${T}x${N}xf32>
}
