// The activations of the dp4 matmuls (mlir/dp4_decode.mlir), x [R, K], quantized per 32-block, one
// invocation per block: d = max|x| / 127, q = round-to-even(x * 127 / max|x|) (all 0 for a block of zeros),
// as llama.cpp's Q8_1. Writes xq [B, 10] words: 0-7 the quants (4 int8 to a word, element 4m + e
// in byte e of word m), 8 the bits of d and 9 those of d * sum q (the Q4_0 offset and the Q4_1
// minimum multiply it): one tensor, so that a matmul reads its x through one binding.
// The bindings are viewed at a zero offset the compiler cannot see, as in mlir/dp4_decode.mlir.
// Placeholders: NAME, K, R (rows of x), KB (blocks a row), B (blocks in all), WG (invocations per
// workgroup), WGS (workgroups), XREF, XQREF (memref types).
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups() -> (index, index, index) {
    %x = arith.constant ${WGS} : index
    %c1 = arith.constant 1 : index
    stream.return %x, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(%b_x: !stream.binding, %b_xq: !stream.binding, %z: index)
        attributes {translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.spirv_pipeline<BaseLowering> workgroup_size = [${WG}, 1, 1]>} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    %c8 = arith.constant 8 : index
    %c32 = arith.constant 32 : index
    %cB = arith.constant ${B} : index
    %cWG = arith.constant ${WG} : index
    %zf = arith.constant 0.0 : f32
    %zi = arith.constant 0 : i32
    %c8i = arith.constant 8 : i32
    %c255 = arith.constant 255 : i32
    %f127 = arith.constant 127.0 : f32
    %x = stream.binding.subspan %b_x[%z] : !stream.binding -> ${XREF}
    %xq = stream.binding.subspan %b_xq[%z] : !stream.binding -> ${XQREF}
    %wg = stream.dispatch.workgroup.id[0] : index
    %t = gpu.thread_id x
    %base = arith.muli %wg, %cWG : index
    %b = arith.addi %base, %t : index
    %inside = arith.cmpi ult, %b, %cB : index
    scf.if %inside {
      %amax = scf.for %j = %c0 to %c32 step %c1 iter_args(%m = %zf) -> (f32) {
        %v = memref.load %x[%b, %j] : ${XREF}
        %a = math.absf %v : f32
        %m2 = arith.maximumf %m, %a : f32
        scf.yield %m2 : f32
      }
      %d = arith.divf %amax, %f127 : f32
      %nz = arith.cmpf ogt, %amax, %zf : f32
      %inv0 = arith.divf %f127, %amax : f32
      %inv = arith.select %nz, %inv0, %zf : f32
      %qsum = scf.for %m = %c0 to %c8 step %c1 iter_args(%s = %zi) -> (i32) {
        %j0 = arith.muli %m, %c4 : index
        %word, %s2 = scf.for %e = %c0 to %c4 step %c1 iter_args(%wd = %zi, %se = %s) -> (i32, i32) {
          %j = arith.addi %j0, %e : index
          %v = memref.load %x[%b, %j] : ${XREF}
          %sc = arith.mulf %v, %inv : f32
          %r = math.roundeven %sc : f32
          %q = arith.fptosi %r : f32 to i32
          %se2 = arith.addi %se, %q : i32
          %byte = arith.andi %q, %c255 : i32
          %ei = arith.index_cast %e : index to i32
          %sh = arith.muli %ei, %c8i : i32
          %pl = arith.shli %byte, %sh : i32
          %wd2 = arith.ori %wd, %pl : i32
          scf.yield %wd2, %se2 : i32, i32
        }
        memref.store %word, %xq[%b, %m] : ${XQREF}
        scf.yield %s2 : i32
      }
      %qs = arith.sitofp %qsum : i32 to f32
      %s = arith.mulf %d, %qs : f32
      %di = arith.bitcast %d : f32 to i32
      %si = arith.bitcast %s : f32 to i32
      %c9 = arith.constant 9 : index
      memref.store %di, %xq[%b, %c8] : ${XQREF}
      memref.store %si, %xq[%b, %c9] : ${XQREF}
    }
    return
    }
  }
}
func.func private @${NAME}(%x: tensor<${R}x${K}xf32>) -> tensor<${R}x${KB}x10xi32> {
  %xb = tensor.expand_shape %x [[0], [1, 2]] output_shape [${R}, ${KB}, 32] : tensor<${R}x${K}xf32> into tensor<${R}x${KB}x32xf32>
  %x2 = tensor.collapse_shape %xb [[0, 1], [2]] : tensor<${R}x${KB}x32xf32> into tensor<${B}x32xf32>
  %c0 = arith.constant 0 : index
  %z = util.optimization_barrier %c0 : index
  %xq = flow.dispatch @${NAME}_ex::@${NAME}(%x2, %z) : (tensor<${B}x32xf32>, index) -> tensor<${B}x10xi32>
  %xr = tensor.expand_shape %xq [[0, 1], [2]] output_shape [${R}, ${KB}, 10] : tensor<${B}x10xi32> into tensor<${R}x${KB}x10xi32>
  return %xr : tensor<${R}x${KB}x10xi32>
}
