// Greedy sampling of every row on the CPU (`Body.argmax_rows` in compiler/emitter.py): the index
// of each row's largest logit, the first one on exact ties, as mlir/argmax_rows.mlir (IREE compiles
// that scan one element at a time). A dispatch written by hand, one workgroup per row: lane l of 16
// keeps the largest of logits l, l + 16, l + 32, ... and its index (the first on ties: the scan goes
// up and only a larger value replaces), then the row's largest value is found over the lanes and,
// of the lanes that hold it, the smallest index taken. NaN never compares larger, so it is never
// chosen; a row with nothing above -inf gives 0. Placeholders: NAME, V (a multiple of 16), C (V / 16).
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups(%t: index) -> (index, index, index) {
    %c1 = arith.constant 1 : index
    stream.return %t, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(%b_x: !stream.binding, %b_y: !stream.binding, %t: index) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c16 = arith.constant 16 : index
      %cC = arith.constant ${C} : index
      %x = stream.binding.subspan %b_x[%c0] : !stream.binding -> memref<?x${V}xf32>{%t}
      %y = stream.binding.subspan %b_y[%c0] : !stream.binding -> memref<?xi32>{%t}
      %row = stream.dispatch.workgroup.id[0] : index
      %ninf = arith.constant dense<0xFF800000> : vector<16xf32>
      %zi = arith.constant dense<0> : vector<16xi32>
      %iota = arith.constant dense<[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]> : vector<16xi32>
      %step = arith.constant dense<16> : vector<16xi32>
      %r:3 = scf.for %c = %c0 to %cC step %c1 iter_args(%m = %ninf, %i = %zi, %at = %iota)
          -> (vector<16xf32>, vector<16xi32>, vector<16xi32>) {
        %off = arith.muli %c, %c16 : index
        %v = vector.load %x[%row, %off] : memref<?x${V}xf32>, vector<16xf32>
        %gt = arith.cmpf ogt, %v, %m : vector<16xf32>
        %nm = arith.select %gt, %v, %m : vector<16xi1>, vector<16xf32>
        %ni = arith.select %gt, %at, %i : vector<16xi1>, vector<16xi32>
        %next = arith.addi %at, %step : vector<16xi32>
        scf.yield %nm, %ni, %next : vector<16xf32>, vector<16xi32>, vector<16xi32>
      }
      %top = vector.reduction <maxnumf>, %r#0 : vector<16xf32> into f32
      %topv = vector.broadcast %top : f32 to vector<16xf32>
      %holds = arith.cmpf oeq, %r#0, %topv : vector<16xf32>
      %none = arith.constant dense<2147483647> : vector<16xi32>
      %cand = arith.select %holds, %r#1, %none : vector<16xi1>, vector<16xi32>
      %first = vector.reduction <minsi>, %cand : vector<16xi32> into i32
      memref.store %first, %y[%row] : memref<?xi32>
      return
    }
  }
}
func.func private @${NAME}(%x: tensor<?x${V}xf32>) -> tensor<?xi32> {
  %c0 = arith.constant 0 : index
  %t = tensor.dim %x, %c0 : tensor<?x${V}xf32>
  %y = flow.dispatch @${NAME}_ex::@${NAME}[%t](%x, %t) : (tensor<?x${V}xf32>{%t}, index) -> tensor<?xi32>{%t}
  return %y : tensor<?xi32>
}
