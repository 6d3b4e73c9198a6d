// RoPE in llama.cpp's NEOX mode (qwen2, qwen3, gemma3): dim i of a head pairs with dim i + HD/2.
// x: [T, H*HD] at positions start + t, viewed as [T, H, 2, P] with P = HD/2 (every dim rotates).
// Pair i rotates by theta = (start + t) * FREQ_SCALE * BASE^(-2i/HD); FREQ_SCALE is linear scaling.
// cs/sn [T, HD/2]: cos and sin of each row's angle per pair (rope_table.mlir, once per step).
// One loop over (t, h, s, i) writes each half in place: y[s] = x[s] cos -+ x[1 - s] sin (minus for
// the first half), both halves read as slices of x. Two results put side by side after the loop
// cost IREE a copy dispatch per half: four a layer with q and k.
// With a projection's bias (qwen2's attn_q/k.bias: BIAS_* filled in), x + bias is what rotates,
// added in the same loop: IREE cannot fuse a separate add into it (the loop reads x at two
// places per element), so the add was a dispatch of its own, two a layer.
func.func private @${NAME}(%x: tensor<${T}x${HHD}xf32>, %cst: tensor<${T}x${P}xf32>, %snt: tensor<${T}x${P}xf32>${BIAS_ARG}) -> tensor<${T}x${HHD}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${HHD}xf32>
  %xr = tensor.expand_shape %x [[0], [1, 2, 3]] output_shape [${TV}, ${H}, 2, ${P}]
      : tensor<${T}x${HHD}xf32> into tensor<${T}x${H}x2x${P}xf32>
  %x0 = tensor.extract_slice %xr[0, 0, 0, 0] [${TV}, ${H}, 1, ${P}] [1, 1, 1, 1]
      : tensor<${T}x${H}x2x${P}xf32> to tensor<${T}x${H}x${P}xf32>
  %x1 = tensor.extract_slice %xr[0, 0, 1, 0] [${TV}, ${H}, 1, ${P}] [1, 1, 1, 1]
      : tensor<${T}x${H}x2x${P}xf32> to tensor<${T}x${H}x${P}xf32>${BIAS_SETUP}
  %e = tensor.empty(${DYN}) : tensor<${T}x${H}x2x${P}xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(t, h, s, i) -> (t, h, i)>,
        affine_map<(t, h, s, i) -> (t, h, i)>, affine_map<(t, h, s, i) -> (t, i)>,
        affine_map<(t, h, s, i) -> (t, i)>${BIAS_MAPS}, affine_map<(t, h, s, i) -> (t, h, s, i)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x0, %x1, %cst, %snt${BIAS_INS} : tensor<${T}x${H}x${P}xf32>, tensor<${T}x${H}x${P}xf32>, tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>${BIAS_TYPES})
      outs(%e : tensor<${T}x${H}x2x${P}xf32>) {
    ^bb0(%lo${BIAS_RAW}: f32, %hi${BIAS_RAW}: f32, %cs: f32, %sn: f32${BIAS_BB}, %o: f32):${BIAS_ADD}
      %s = linalg.index 2 : index
      %first = arith.cmpi eq, %s, %c0 : index
      %self = arith.select %first, %lo, %hi : f32
      %other = arith.select %first, %hi, %lo : f32
      %a = arith.mulf %self, %cs : f32
      %b = arith.mulf %other, %sn : f32
      %nb = arith.negf %b : f32
      %bs = arith.select %first, %nb, %b : f32
      %y = arith.addf %a, %bs : f32
      linalg.yield %y : f32
  } -> tensor<${T}x${H}x2x${P}xf32>
  %y = tensor.collapse_shape %r [[0], [1, 2, 3]] : tensor<${T}x${H}x2x${P}xf32> into tensor<${T}x${HHD}xf32>
  return %y : tensor<${T}x${HHD}xf32>
}
