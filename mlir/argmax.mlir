// Greedy sampling on the device: the index of each row's largest logit (the first one on exact
// ties; NaNs ignored; 0 for a row with nothing above -inf). x [T, V] -> [T] i32, T static 1 or
// dynamic. The row is padded with -inf to NB blocks of B (B at most 1024) and reduced in two
// levels, each a plain reduction (the largest value, then the first index holding it): on
// Vulkan, IREE 3.13 compiles one reduction over a whole 262,144-wide row as a single invocation
// looping over it (one workgroup of one thread), and lavapipe stops a shader's loops after 65,535
// iterations, so Gemma 3's tokens past them were never picked (tests/kernels/test_argmax.py); on
// a GPU that one thread would read the whole row alone. On named GPU targets the block and
// element numbers come from i32 iota constants instead of linalg.index
// (zinc.compiler.targets.index_inputs says why).
// The first index is found as the largest rank V - index (0: none) under maxsi, not the smallest
// index under minsi: IREE 3.13's SubgroupReduce pads a workgroup whose subgroups are fewer than a
// subgroup's lanes with -1, the neutral value of an unsigned min, so a signed min of indices came
// out -1 (a 48-block row on 8- or 16-wide subgroups: SmolLM2 on lavapipe or Mali, test_argmax);
// below every rank, that padding is harmless to a max.
func.func private @${NAME}(%x: tensor<${T}x${V}xf32>) -> tensor<${T}xi32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<${T}x${V}xf32>
  %ninf = arith.constant 0xFF800000 : f32
  %vmax = arith.constant ${V} : i32
  %bsz = arith.constant ${B} : i32
  %z = arith.constant 0 : i32
  %xp = tensor.pad %x low[0, 0] high[0, ${PAD}] {
    ^bb0(%pi: index, %pj: index):
      tensor.yield %ninf : f32
  } : tensor<${T}x${V}xf32> to tensor<${T}x${VP}xf32>
  %xb = tensor.expand_shape %xp [[0], [1, 2]] output_shape [${TV}, ${NB}, ${B}]
      : tensor<${T}x${VP}xf32> into tensor<${T}x${NB}x${B}xf32>
  // per block: the largest value, then the first index holding it
  %eb = tensor.empty(${DYN}) : tensor<${T}x${NB}xf32>
  %mb0 = linalg.fill ins(%ninf : f32) outs(%eb : tensor<${T}x${NB}xf32>) -> tensor<${T}x${NB}xf32>
  %mb = linalg.generic {indexing_maps = [affine_map<(t, n, b) -> (t, n, b)>, affine_map<(t, n, b) -> (t, n)>],
      iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%xb : tensor<${T}x${NB}x${B}xf32>) outs(%mb0 : tensor<${T}x${NB}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.maxnumf %a, %o : f32
      linalg.yield %r : f32
  } -> tensor<${T}x${NB}xf32>
  %ebi = tensor.empty(${DYN}) : tensor<${T}x${NB}xi32>
  %ib0 = linalg.fill ins(%z : i32) outs(%ebi : tensor<${T}x${NB}xi32>) -> tensor<${T}x${NB}xi32>
${IOTAS}  %ib = linalg.generic {indexing_maps = [affine_map<(t, n, b) -> (t, n, b)>, affine_map<(t, n, b) -> (t, n)>,
        ${IOTA_MAPS}affine_map<(t, n, b) -> (t, n)>], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%xb, %mb${IOTA_INS} : tensor<${T}x${NB}x${B}xf32>, tensor<${T}x${NB}xf32>${IOTA_TYPES}) outs(%ib0 : tensor<${T}x${NB}xi32>) {
    ^bb0(%a: f32, %m: f32, ${IOTA_ARGS}%o: i32):
${INDICES}      %base = arith.muli %ni, %bsz : i32
      %at = arith.addi %base, %bi : i32
      %rank = arith.subi %vmax, %at : i32
      %eq = arith.cmpf oeq, %a, %m : f32
      %c = arith.select %eq, %rank, %z : i32
      %r = arith.maxsi %c, %o : i32
      linalg.yield %r : i32
  } -> tensor<${T}x${NB}xi32>
  // over the blocks: the largest value, then the first block's index holding it
  %er = tensor.empty(${DYN}) : tensor<${T}xf32>
  %m0 = linalg.fill ins(%ninf : f32) outs(%er : tensor<${T}xf32>) -> tensor<${T}xf32>
  %m = linalg.generic {indexing_maps = [affine_map<(t, n) -> (t, n)>, affine_map<(t, n) -> (t)>],
      iterator_types = ["parallel", "reduction"]}
      ins(%mb : tensor<${T}x${NB}xf32>) outs(%m0 : tensor<${T}xf32>) {
    ^bb0(%a: f32, %o: f32):
      %r = arith.maxnumf %a, %o : f32
      linalg.yield %r : f32
  } -> tensor<${T}xf32>
  %eri = tensor.empty(${DYN}) : tensor<${T}xi32>
  %i0 = linalg.fill ins(%z : i32) outs(%eri : tensor<${T}xi32>) -> tensor<${T}xi32>
  %i = linalg.generic {indexing_maps = [affine_map<(t, n) -> (t, n)>, affine_map<(t, n) -> (t, n)>,
        affine_map<(t, n) -> (t)>, affine_map<(t, n) -> (t)>], iterator_types = ["parallel", "reduction"]}
      ins(%mb, %ib, %m : tensor<${T}x${NB}xf32>, tensor<${T}x${NB}xi32>, tensor<${T}xf32>) outs(%i0 : tensor<${T}xi32>) {
    ^bb0(%a: f32, %ai: i32, %best: f32, %o: i32):
      %eq = arith.cmpf oeq, %a, %best : f32
      %c = arith.select %eq, %ai, %z : i32
      %r = arith.maxsi %c, %o : i32
      linalg.yield %r : i32
  } -> tensor<${T}xi32>
  %y = linalg.generic {indexing_maps = [affine_map<(t) -> (t)>, affine_map<(t) -> (t)>, affine_map<(t) -> (t)>],
      iterator_types = ["parallel"]}
      ins(%i, %m : tensor<${T}xi32>, tensor<${T}xf32>) outs(%eri : tensor<${T}xi32>) {
    ^bb0(%a: i32, %best: f32, %o: i32):
      %none = arith.cmpf oeq, %best, %ninf : f32
      %at = arith.subi %vmax, %a : i32
      %r = arith.select %none, %z, %at : i32
      linalg.yield %r : i32
  } -> tensor<${T}xi32>
  return %y : tensor<${T}xi32>
}
