// The activations of a dot8 kernel (compiler/dot8.py) quantized once, before it, by a dispatch of
// their own: used where the kernel's quantized rows would not fit its stack (long rows, many rows
// a tile). One workgroup per row of x [T, B, 32] writes xq [T, B, 32] i8 and dx, sx [T, B] f32.
// Placeholders: NAME, WG_ARGS, WG_COUNT, T_ARG, TD (the dynamic size of T, or empty), XR (T, or ?),
// B, BLOCK (mlir/dot8_quantize_block.mlir, with the row %row), SH_BINDING and SH_SETUP (Q6_K's
// sums of each block's first 16, or empty).
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups(${WG_ARGS}) -> (index, index, index) {
${WG_COUNT}
    %c1 = arith.constant 1 : index
    stream.return %n, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(%b_x: !stream.binding, %b_xq: !stream.binding, %b_dx: !stream.binding, %b_sx: !stream.binding${SH_BINDING}${T_ARG}) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %cB = arith.constant ${B} : index
    %fzero = arith.constant 0.0 : f32
    %fmax = arith.constant 127.0 : f32
    %x = stream.binding.subspan %b_x[%c0] : !stream.binding -> memref<${XR}x${B}x32xf32>${TD}
    %xq = stream.binding.subspan %b_xq[%c0] : !stream.binding -> memref<${XR}x${B}x32xi8>${TD}
    %dx = stream.binding.subspan %b_dx[%c0] : !stream.binding -> memref<${XR}x${B}xf32>${TD}
    %sx = stream.binding.subspan %b_sx[%c0] : !stream.binding -> memref<${XR}x${B}xf32>${TD}
${SH_SETUP}
    %row = stream.dispatch.workgroup.id[0] : index
    scf.for %b = %c0 to %cB step %c1 {
${BLOCK}
    }
    return
    }
  }
}
