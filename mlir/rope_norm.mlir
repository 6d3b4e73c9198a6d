// RoPE on adjacent pairs (llama.cpp's "norm" mode; GGUF llama q/k weights are permuted for it).
// x: [T, H*HD] at positions start + t. Pair i of a head (i < NR/2) rotates by
// theta = pos * base^(-2i/NR); dims past NR (partial rotary) pass through.
// cs/sn [T, HD/2]: cos and sin of each row's angle per pair (rope_table.mlir, once per step).
func.func private @${NAME}(%x: tensor<${T}x${HHD}xf32>, %cst: tensor<${T}x${P}xf32>, %snt: tensor<${T}x${P}xf32>) -> tensor<${T}x${HHD}xf32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${HHD}xf32>
  %xr = tensor.expand_shape %x [[0], [1, 2, 3]] output_shape [${TV}, ${H}, ${P}, 2]
      : tensor<${T}x${HHD}xf32> into tensor<${T}x${H}x${P}x2xf32>
  %e = tensor.empty(${DYN}) : tensor<${T}x${H}x${P}x2xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(t, h, i, c) -> (t, h, i, 0)>,
        affine_map<(t, h, i, c) -> (t, h, i, 1)>, affine_map<(t, h, i, c) -> (t, i)>,
        affine_map<(t, h, i, c) -> (t, i)>, affine_map<(t, h, i, c) -> (t, h, i, c)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%xr, %xr, %cst, %snt : tensor<${T}x${H}x${P}x2xf32>, tensor<${T}x${H}x${P}x2xf32>, tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>) outs(%e : tensor<${T}x${H}x${P}x2xf32>) {
    ^bb0(%x0: f32, %x1: f32, %cs: f32, %sn: f32, %o: f32):
      %i = linalg.index 2 : index
      %c = linalg.index 3 : index
      %a = arith.mulf %x0, %cs : f32
      %b = arith.mulf %x1, %sn : f32
      %r0 = arith.subf %a, %b : f32
      %a1 = arith.mulf %x0, %sn : f32
      %b1 = arith.mulf %x1, %cs : f32
      %r1 = arith.addf %a1, %b1 : f32
      %zi = arith.constant 0 : index
      %first = arith.cmpi eq, %c, %zi : index
      %rot = arith.select %first, %r0, %r1 : f32
      %keep = arith.select %first, %x0, %x1 : f32
      %nr2 = arith.constant ${NR2} : index
      %inside = arith.cmpi ult, %i, %nr2 : index
      %y = arith.select %inside, %rot, %keep : f32
      linalg.yield %y : f32
  } -> tensor<${T}x${H}x${P}x2xf32>
  %y = tensor.collapse_shape %r [[0], [1, 2, 3]] : tensor<${T}x${H}x${P}x2xf32> into tensor<${T}x${HHD}xf32>
  return %y : tensor<${T}x${HHD}xf32>
}
