// RoPE in llama.cpp's NEOX mode (qwen2, qwen3, gemma3): dim i of a head pairs with dim i + HD/2.
// x: [T, H*HD] at positions start + t, viewed as [T, H, 2, P] with P = HD/2 (every dim rotates).
// Pair i rotates by theta = (start + t) * FREQ_SCALE * BASE^(-2i/HD); FREQ_SCALE is linear scaling.
// cs/sn [T, HD/2]: cos and sin of each row's angle per pair (rope_table.mlir, once per step).
// Both halves of a pair come out of one loop over (t, h, i) as two results, put side by side
// after: a single loop over (t, h, half, i) choosing the formula by half ran 1.8x slower on the
// CPU (Gemma 3's Q, 128 rows: 0.22 vs 0.13 ms).
func.func private @${NAME}(%x: tensor<${T}x${HHD}xf32>, %cst: tensor<${T}x${P}xf32>, %snt: tensor<${T}x${P}xf32>) -> tensor<${T}x${HHD}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${HHD}xf32>
  %xr = tensor.expand_shape %x [[0], [1, 2, 3]] output_shape [${TV}, ${H}, 2, ${P}]
      : tensor<${T}x${HHD}xf32> into tensor<${T}x${H}x2x${P}xf32>
  %e = tensor.empty(${DYN}) : tensor<${T}x${H}x${P}xf32>
  %r:2 = linalg.generic {indexing_maps = [affine_map<(t, h, i) -> (t, h, 0, i)>,
        affine_map<(t, h, i) -> (t, h, 1, i)>, affine_map<(t, h, i) -> (t, i)>,
        affine_map<(t, h, i) -> (t, i)>, affine_map<(t, h, i) -> (t, h, i)>, affine_map<(t, h, i) -> (t, h, i)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%xr, %xr, %cst, %snt : tensor<${T}x${H}x2x${P}xf32>, tensor<${T}x${H}x2x${P}xf32>, tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>)
      outs(%e, %e : tensor<${T}x${H}x${P}xf32>, tensor<${T}x${H}x${P}xf32>) {
    ^bb0(%x0: f32, %x1: f32, %cs: f32, %sn: f32, %o0: f32, %o1: f32):
      %a = arith.mulf %x0, %cs : f32
      %b = arith.mulf %x1, %sn : f32
      %r0 = arith.subf %a, %b : f32
      %a1 = arith.mulf %x0, %sn : f32
      %b1 = arith.mulf %x1, %cs : f32
      %r1 = arith.addf %a1, %b1 : f32
      linalg.yield %r0, %r1 : f32, f32
  } -> (tensor<${T}x${H}x${P}xf32>, tensor<${T}x${H}x${P}xf32>)
  %e2 = tensor.empty(${DYN}) : tensor<${T}x${H}x2x${P}xf32>
  %y0 = tensor.insert_slice %r#0 into %e2[0, 0, 0, 0] [${TV}, ${H}, 1, ${P}] [1, 1, 1, 1]
      : tensor<${T}x${H}x${P}xf32> into tensor<${T}x${H}x2x${P}xf32>
  %y1 = tensor.insert_slice %r#1 into %y0[0, 0, 1, 0] [${TV}, ${H}, 1, ${P}] [1, 1, 1, 1]
      : tensor<${T}x${H}x${P}xf32> into tensor<${T}x${H}x2x${P}xf32>
  %y = tensor.collapse_shape %y1 [[0], [1, 2, 3]] : tensor<${T}x${H}x2x${P}xf32> into tensor<${T}x${HHD}xf32>
  return %y : tensor<${T}x${HHD}xf32>
}
