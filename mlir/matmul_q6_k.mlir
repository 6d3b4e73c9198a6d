// y[t, n] = sum_k x[t, k] * W[n, k], W in GGUF Q6_K super-blocks read raw from the parameter:
// 210 bytes per 256 weights = 128 bytes of low nibbles ql (0-127), 64 bytes of 2-bit highs qh
// (128-191), 16 int8 scales (192-207, one per 16 weights), f16 d (208-209).
// Weight 128a + 32m + l (a < 2, m < 4, l < 32) has q = (ql[64a + 32(m % 2) + l] >> 4(m / 2)) & 15
// | ((qh[32a + l] >> 2m) & 3) << 4 and w = d * scales[(128a + 32m + l) / 16] * (q - 32).
// Loop dims (t, n, b, a, mh, ml, lh, ll): m = 2mh + ml, l = 16lh + ll, so every byte is read
// through a projected permutation: ql at (a, ml, lh, ll), qh at (a, lh, ll), scales at (a, mh, ml, lh).
// Placeholders: as matmul_q8_0.mlir.
func.func private @${NAME}(%w: tensor<${N}x${B}x210xi8>, %x: tensor<${T}x${K}xf32>) -> tensor<${T}x${N}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${K}xf32>
  %qlf = tensor.extract_slice %w[0, 0, 0] [${N}, ${B}, 128] [1, 1, 1] : tensor<${N}x${B}x210xi8> to tensor<${N}x${B}x128xi8>
  %ql = tensor.expand_shape %qlf [[0], [1], [2, 3, 4, 5]] output_shape [${N}, ${B}, 2, 2, 2, 16] : tensor<${N}x${B}x128xi8> into tensor<${N}x${B}x2x2x2x16xi8>
  %qhf = tensor.extract_slice %w[0, 0, 128] [${N}, ${B}, 64] [1, 1, 1] : tensor<${N}x${B}x210xi8> to tensor<${N}x${B}x64xi8>
  %qh = tensor.expand_shape %qhf [[0], [1], [2, 3, 4]] output_shape [${N}, ${B}, 2, 2, 16] : tensor<${N}x${B}x64xi8> into tensor<${N}x${B}x2x2x16xi8>
  %scf = tensor.extract_slice %w[0, 0, 192] [${N}, ${B}, 16] [1, 1, 1] : tensor<${N}x${B}x210xi8> to tensor<${N}x${B}x16xi8>
  %sc = tensor.expand_shape %scf [[0], [1], [2, 3, 4, 5]] output_shape [${N}, ${B}, 2, 2, 2, 2] : tensor<${N}x${B}x16xi8> into tensor<${N}x${B}x2x2x2x2xi8>
  %dl = tensor.extract_slice %w[0, 0, 208] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x210xi8> to tensor<${N}x${B}xi8>
  %dh = tensor.extract_slice %w[0, 0, 209] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x210xi8> to tensor<${N}x${B}xi8>
  %xb = tensor.expand_shape %x [[0], [1, 2, 3, 4, 5, 6]] output_shape [${TV}, ${B}, 2, 2, 2, 2, 16] : tensor<${T}x${K}xf32> into tensor<${T}x${B}x2x2x2x2x16xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(${DYN}) : tensor<${T}x${N}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<${T}x${N}xf32>) -> tensor<${T}x${N}xf32>
  %y = linalg.generic {indexing_maps = [
        affine_map<(t, n, b, a, mh, ml, lh, ll) -> (n, b, a, ml, lh, ll)>,
        affine_map<(t, n, b, a, mh, ml, lh, ll) -> (n, b, a, lh, ll)>,
        affine_map<(t, n, b, a, mh, ml, lh, ll) -> (n, b, a, mh, ml, lh)>,
        affine_map<(t, n, b, a, mh, ml, lh, ll) -> (n, b)>, affine_map<(t, n, b, a, mh, ml, lh, ll) -> (n, b)>,
        affine_map<(t, n, b, a, mh, ml, lh, ll) -> (t, b, a, mh, ml, lh, ll)>,
        affine_map<(t, n, b, a, mh, ml, lh, ll) -> (t, n)>],
      iterator_types = ["parallel", "parallel", "reduction", "reduction", "reduction", "reduction", "reduction", "reduction"]}
      ins(%ql, %qh, %sc, %dl, %dh, %xb : tensor<${N}x${B}x2x2x2x16xi8>, tensor<${N}x${B}x2x2x16xi8>,
          tensor<${N}x${B}x2x2x2x2xi8>, tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>, tensor<${T}x${B}x2x2x2x2x16xf32>)
      outs(%acc : tensor<${T}x${N}xf32>) {
    ^bb0(%qlb: i8, %qhb: i8, %scb: i8, %lo: i8, %hi: i8, %xv: f32, %a: f32):
${F16_D}
      %scv = arith.sitofp %scb : i8 to f32
      %ds = arith.mulf %d, %scv : f32
      %mh = linalg.index 4 : index
      %ml = linalg.index 5 : index
      %mh8 = arith.index_cast %mh : index to i8
      %ml8 = arith.index_cast %ml : index to i8
      %c2 = arith.constant 2 : i8
      %c4 = arith.constant 4 : i8
      %c3 = arith.constant 3 : i8
      %c15 = arith.constant 15 : i8
      %c32 = arith.constant 32 : i8
      %lsh = arith.muli %mh8, %c4 : i8
      %qls = arith.shrui %qlb, %lsh : i8
      %qn = arith.andi %qls, %c15 : i8
      %hsh2 = arith.muli %ml8, %c2 : i8
      %hsh = arith.addi %lsh, %hsh2 : i8
      %qhs = arith.shrui %qhb, %hsh : i8
      %qh2 = arith.andi %qhs, %c3 : i8
      %qh4 = arith.shli %qh2, %c4 : i8
      %q6 = arith.ori %qn, %qh4 : i8
      %qc = arith.subi %q6, %c32 : i8
      %qf = arith.sitofp %qc : i8 to f32
      %wv = arith.mulf %qf, %ds : f32
      %p = arith.mulf %wv, %xv : f32
      %s = arith.addf %a, %p : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${N}xf32>
  return %y : tensor<${T}x${N}xf32>
}
