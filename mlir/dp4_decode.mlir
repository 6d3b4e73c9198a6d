// y[T, n] = x[T, k] @ W[n, k]^T for a few tokens (decode: T = 1, or a batch's rows) on a Vulkan GPU
// with integer dot products (compiler/dp4.py): a dispatch written by hand. W is the GGUF tensor as
// it is, read as 32-bit words (compiler/dp4_units.py: a type's units); x comes quantized per
// 32-block (mlir/dp4_quantize.mlir: xq [T, B, 10] words, 8 of 4 int8 each, then the bits of dx and
// sx). A workgroup is SG subgroups of S invocations (workgroup size [S, SG], so invocation y is the
// subgroup); each subgroup takes one row of W (so a 2,048-row matrix spreads over 2,048 subgroups,
// as many as a large GPU keeps in flight), its invocations units lane, lane + S, ... of the row, so
// a subgroup's loads of the row are contiguous, and each unit is read once for the T
// tokens. Per 32-block and token: SDotAccSat of 4 weights and 4 activations at a time, then the
// block's scale and bias in f32; each token's sum is a subgroup reduction. Every binding is viewed
// at offset %z, a zero the compiler cannot see (an optimization barrier at the call), so that its
// memref always has a dynamic offset (`strided<..., offset: ?>`): IREE passes some bindings'
// offsets at run time and others not, and its SPIR-V lowering fails on a hand-written memref
// whose type does not say which. Placeholders: NAME, S, SG, T, WGS (workgroups), N, U (units
// per row), B, WTYPE (the weight's tensor type), WREF, XQREF, YREF (the memref types), CONSTS,
// UNIT (one unit's lines, from %acc0.. to %out0..), ITER, TYPES, RESULTS, YIELD, STORES.
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups() -> (index, index, index) {
    %x = arith.constant ${WGS} : index
    %c1 = arith.constant 1 : index
    stream.return %x, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(%b_w: !stream.binding, %b_xq: !stream.binding, %b_y: !stream.binding, %z: index)
        attributes {translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.spirv_pipeline<BaseLowering> workgroup_size = [${S}, ${SG}, 1] subgroup_size = ${S}>} {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    %c4 = arith.constant 4 : index
    %c8 = arith.constant 8 : index
    %c12 = arith.constant 12 : index
    %c16 = arith.constant 16 : index
    %c32 = arith.constant 32 : index
    %c48 = arith.constant 48 : index
    %c52 = arith.constant 52 : index
    %cS = arith.constant ${S} : index
    %cSG = arith.constant ${SG} : index
    %cU = arith.constant ${U} : index
    %cN = arith.constant ${N} : index
    %nib = arith.constant 252645135 : i32  // 0x0F0F0F0F: the low nibble of each byte
    %c0i = arith.constant 0 : i32
    %c1i = arith.constant 1 : i32
    %c2i = arith.constant 2 : i32
    %c3i = arith.constant 3 : i32
    %c4i = arith.constant 4 : i32
    %c8i = arith.constant 8 : i32
    %c16i = arith.constant 16 : i32
    %c11i = arith.constant 11 : i32
    %c65535i = arith.constant 65535 : i32
    %c12i = arith.constant 12 : i32
    %c18i = arith.constant 18 : i32
    %c20i = arith.constant 20 : i32
    %c24i = arith.constant 24 : i32
    %c25i = arith.constant 25 : i32
    %c28i = arith.constant 28 : i32
    %m01 = arith.constant 16843009 : i32  // 0x01010101
    %m03 = arith.constant 50529027 : i32  // 0x03030303
    %m20 = arith.constant 538976288 : i32  // 0x20202020
    %c255i = arith.constant 255 : i32
    %zi = arith.constant 0 : i32
    %zf = arith.constant 0.0 : f32
    %m8 = arith.constant -8.0 : f32
    %m16 = arith.constant -16.0 : f32
${CONSTS}
    %w = stream.binding.subspan %b_w[%z] : !stream.binding -> ${WREF}
    %xq = stream.binding.subspan %b_xq[%z] : !stream.binding -> ${XQREF}
    %y = stream.binding.subspan %b_y[%z] : !stream.binding -> ${YREF}
    %wg = stream.dispatch.workgroup.id[0] : index
    %lane = gpu.thread_id x
    %sg = gpu.thread_id y
    %wsg = arith.muli %wg, %cSG : index
    %row = arith.addi %wsg, %sg : index
    %first = arith.cmpi eq, %lane, %c0 : index
    %inside = arith.cmpi ult, %row, %cN : index
    scf.if %inside {
      ${RESULTS} = scf.for %u = %lane to %cU step %cS iter_args(${ITER}) -> (${TYPES}) {
${UNIT}
        scf.yield ${YIELD} : ${TYPES}
      }
${STORES}
    }
    return
    }
  }
}
func.func private @${NAME}(%w: ${WTYPE}, %xq: tensor<${T}x${B}x10xi32>) -> tensor<${T}x${N}xf32> {
  %c0 = arith.constant 0 : index
  %z = util.optimization_barrier %c0 : index
  %y = flow.dispatch @${NAME}_ex::@${NAME}(%w, %xq, %z) : (${WTYPE}, tensor<${T}x${B}x10xi32>, index) -> tensor<${T}x${N}xf32>
  return %y : tensor<${T}x${N}xf32>
}
