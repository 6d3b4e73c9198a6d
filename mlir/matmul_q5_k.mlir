// y[t, n] = sum_k x[t, k] * W[n, k], W in GGUF Q5_K super-blocks read raw from the parameter:
// 176 bytes per 256 weights = f16 d (bytes 0-1), f16 dmin (2-3), 12 bytes of packed 6-bit
// sub-block scales and mins (4-15, see bitops.kquant_scale), 32 bytes of high bits qh (16-47),
// 128 bytes of low nibbles (48-175). Nibble byte 32c + l holds weight 64c + l (low nibble,
// sub-block 2c) and 64c + 32 + l (high nibble, sub-block 2c + 1); bit s of qh[l] is bit 4 of
// weight l of sub-block s; w = d * sc[s] * q - dmin * m[s].
// Loop dims (t, n, b, u, c, h, l): k = 256b + 128u + 64c + 32h + l, s = 4u + 2c + h; the scale
// bytes of s are A/B/C[2c + h], so each 4-byte scale row is viewed as [2, 2] and read at (c, h).
// Placeholders: as matmul_q4_1.mlir (F16_M decodes dmin into %m), plus KSCALE (%ka, %kb, %kc,
// %upper -> %ds, %dm).
func.func private @${NAME}(%w: tensor<${N}x${B}x176xi8>, %x: tensor<${T}x${K}xf32>) -> tensor<${T}x${N}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${K}xf32>
  %qsf = tensor.extract_slice %w[0, 0, 48] [${N}, ${B}, 128] [1, 1, 1] : tensor<${N}x${B}x176xi8> to tensor<${N}x${B}x128xi8>
  %qs = tensor.expand_shape %qsf [[0], [1], [2, 3, 4]] output_shape [${N}, ${B}, 2, 2, 32] : tensor<${N}x${B}x128xi8> into tensor<${N}x${B}x2x2x32xi8>
  %saf = tensor.extract_slice %w[0, 0, 4] [${N}, ${B}, 4] [1, 1, 1] : tensor<${N}x${B}x176xi8> to tensor<${N}x${B}x4xi8>
  %sa = tensor.expand_shape %saf [[0], [1], [2, 3]] output_shape [${N}, ${B}, 2, 2] : tensor<${N}x${B}x4xi8> into tensor<${N}x${B}x2x2xi8>
  %sbf = tensor.extract_slice %w[0, 0, 8] [${N}, ${B}, 4] [1, 1, 1] : tensor<${N}x${B}x176xi8> to tensor<${N}x${B}x4xi8>
  %sb = tensor.expand_shape %sbf [[0], [1], [2, 3]] output_shape [${N}, ${B}, 2, 2] : tensor<${N}x${B}x4xi8> into tensor<${N}x${B}x2x2xi8>
  %scf = tensor.extract_slice %w[0, 0, 12] [${N}, ${B}, 4] [1, 1, 1] : tensor<${N}x${B}x176xi8> to tensor<${N}x${B}x4xi8>
  %sc = tensor.expand_shape %scf [[0], [1], [2, 3]] output_shape [${N}, ${B}, 2, 2] : tensor<${N}x${B}x4xi8> into tensor<${N}x${B}x2x2xi8>
  %qh = tensor.extract_slice %w[0, 0, 16] [${N}, ${B}, 32] [1, 1, 1] : tensor<${N}x${B}x176xi8> to tensor<${N}x${B}x32xi8>
  %dl = tensor.extract_slice %w[0, 0, 0] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x176xi8> to tensor<${N}x${B}xi8>
  %dh = tensor.extract_slice %w[0, 0, 1] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x176xi8> to tensor<${N}x${B}xi8>
  %ml = tensor.extract_slice %w[0, 0, 2] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x176xi8> to tensor<${N}x${B}xi8>
  %mh = tensor.extract_slice %w[0, 0, 3] [${N}, ${B}, 1] [1, 1, 1] : tensor<${N}x${B}x176xi8> to tensor<${N}x${B}xi8>
  %xb = tensor.expand_shape %x [[0], [1, 2, 3, 4, 5]] output_shape [${TV}, ${B}, 2, 2, 2, 32] : tensor<${T}x${K}xf32> into tensor<${T}x${B}x2x2x2x32xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(${DYN}) : tensor<${T}x${N}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<${T}x${N}xf32>) -> tensor<${T}x${N}xf32>
  %y = linalg.generic {indexing_maps = [
        affine_map<(t, n, b, u, c, h, l) -> (n, b, u, c, l)>, affine_map<(t, n, b, u, c, h, l) -> (n, b, l)>,
        affine_map<(t, n, b, u, c, h, l) -> (n, b, c, h)>, affine_map<(t, n, b, u, c, h, l) -> (n, b, c, h)>,
        affine_map<(t, n, b, u, c, h, l) -> (n, b, c, h)>,
        affine_map<(t, n, b, u, c, h, l) -> (n, b)>, affine_map<(t, n, b, u, c, h, l) -> (n, b)>,
        affine_map<(t, n, b, u, c, h, l) -> (n, b)>, affine_map<(t, n, b, u, c, h, l) -> (n, b)>,
        affine_map<(t, n, b, u, c, h, l) -> (t, b, u, c, h, l)>,
        affine_map<(t, n, b, u, c, h, l) -> (t, n)>],
      iterator_types = ["parallel", "parallel", "reduction", "reduction", "reduction", "reduction", "reduction"]}
      ins(%qs, %qh, %sa, %sb, %sc, %dl, %dh, %ml, %mh, %xb : tensor<${N}x${B}x2x2x32xi8>, tensor<${N}x${B}x32xi8>,
          tensor<${N}x${B}x2x2xi8>, tensor<${N}x${B}x2x2xi8>, tensor<${N}x${B}x2x2xi8>,
          tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>, tensor<${N}x${B}xi8>,
          tensor<${T}x${B}x2x2x2x32xf32>)
      outs(%acc : tensor<${T}x${N}xf32>) {
    ^bb0(%q: i8, %qhb: i8, %ka: i8, %kb: i8, %kc: i8, %lo: i8, %hi: i8, %mlo: i8, %mhi: i8, %xv: f32, %a: f32):
${F16_D}
${F16_M}
      %u = linalg.index 3 : index
      %i0 = arith.constant 0 : index
      %upper = arith.cmpi ne, %u, %i0 : index
${KSCALE}
      %h = linalg.index 5 : index
      %h8 = arith.index_cast %h : index to i8
      %c4 = arith.constant 4 : i8
      %sh = arith.muli %h8, %c4 : i8
      %qsh = arith.shrui %q, %sh : i8
      %c15 = arith.constant 15 : i8
      %qn = arith.andi %qsh, %c15 : i8
      %c = linalg.index 4 : index
      %c8 = arith.index_cast %c : index to i8
      %u8 = arith.index_cast %u : index to i8
      %c2 = arith.constant 2 : i8
      %s4 = arith.muli %u8, %c4 : i8
      %s2 = arith.muli %c8, %c2 : i8
      %s42 = arith.addi %s4, %s2 : i8
      %sub = arith.addi %s42, %h8 : i8
      %qhs = arith.shrui %qhb, %sub : i8
      %c1 = arith.constant 1 : i8
      %hb = arith.andi %qhs, %c1 : i8
      %h16 = arith.shli %hb, %c4 : i8
      %q5 = arith.ori %qn, %h16 : i8
      %qf = arith.uitofp %q5 : i8 to f32
      %wd = arith.mulf %qf, %ds : f32
      %wv = arith.subf %wd, %dm : f32
      %p = arith.mulf %wv, %xv : f32
      %s = arith.addf %a, %p : f32
      linalg.yield %s : f32
  } -> tensor<${T}x${N}xf32>
  return %y : tensor<${T}x${N}xf32>
}
