// RoPE on adjacent pairs over every dim of each head, on the CPU (`Body.rope` in
// compiler/emitter.py): the same results as mlir/rope_norm.mlir, which IREE compiles one element
// at a time. A dispatch written by hand, one workgroup per row: 16 elements (8 pairs) at a time,
// with cos and sin of the row's angles (rope_table.mlir) each spread to both elements of a pair
// and the pairs' elements swapped by shuffles; pair (x0, x1) becomes
// (fma(x0, cos, -(x1 * sin)), fma(x1, cos, x0 * sin)), the operations LLVM makes of the linalg form.
// Placeholders: NAME, HHD (heads * HD), H, HD (a multiple of 16), P (HD / 2), C (HD / 16).
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups(%t: index) -> (index, index, index) {
    %c1 = arith.constant 1 : index
    stream.return %t, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(%b_x: !stream.binding, %b_cs: !stream.binding, %b_sn: !stream.binding,
                       %b_y: !stream.binding, %t: index) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c8 = arith.constant 8 : index
      %c16 = arith.constant 16 : index
      %cH = arith.constant ${H} : index
      %cHD = arith.constant ${HD} : index
      %cC = arith.constant ${C} : index
      %x = stream.binding.subspan %b_x[%c0] : !stream.binding -> memref<?x${HHD}xf32>{%t}
      %cs = stream.binding.subspan %b_cs[%c0] : !stream.binding -> memref<?x${P}xf32>{%t}
      %sn = stream.binding.subspan %b_sn[%c0] : !stream.binding -> memref<?x${P}xf32>{%t}
      %y = stream.binding.subspan %b_y[%c0] : !stream.binding -> memref<?x${HHD}xf32>{%t}
      %row = stream.dispatch.workgroup.id[0] : index
      %sign = arith.constant dense<[-1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0]> : vector<16xf32>
      scf.for %c = %c0 to %cC step %c1 {
        %p0 = arith.muli %c, %c8 : index
        %c8v = vector.load %cs[%row, %p0] : memref<?x${P}xf32>, vector<8xf32>
        %s8v = vector.load %sn[%row, %p0] : memref<?x${P}xf32>, vector<8xf32>
        %cv = vector.shuffle %c8v, %c8v [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7] : vector<8xf32>, vector<8xf32>
        %sv = vector.shuffle %s8v, %s8v [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7] : vector<8xf32>, vector<8xf32>
        %e0 = arith.muli %c, %c16 : index
        scf.for %h = %c0 to %cH step %c1 {
          %hb = arith.muli %h, %cHD : index
          %off = arith.addi %hb, %e0 : index
          %v = vector.load %x[%row, %off] : memref<?x${HHD}xf32>, vector<16xf32>
          %sw = vector.shuffle %v, %v [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14] : vector<16xf32>, vector<16xf32>
          %ps = arith.mulf %sw, %sv : vector<16xf32>
          %pss = arith.mulf %ps, %sign : vector<16xf32>
          %r = math.fma %v, %cv, %pss : vector<16xf32>
          vector.store %r, %y[%row, %off] : memref<?x${HHD}xf32>, vector<16xf32>
        }
      }
      return
    }
  }
}
func.func private @${NAME}(%x: tensor<?x${HHD}xf32>, %cs: tensor<?x${P}xf32>, %sn: tensor<?x${P}xf32>) -> tensor<?x${HHD}xf32> {
  %c0 = arith.constant 0 : index
  %t = tensor.dim %x, %c0 : tensor<?x${HHD}xf32>
  %y = flow.dispatch @${NAME}_ex::@${NAME}[%t](%x, %cs, %sn, %t)
      : (tensor<?x${HHD}xf32>{%t}, tensor<?x${P}xf32>{%t}, tensor<?x${P}xf32>{%t}, index) -> tensor<?x${HHD}xf32>{%t}
  return %y : tensor<?x${HHD}xf32>
}
