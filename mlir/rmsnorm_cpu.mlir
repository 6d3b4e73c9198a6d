// RMSNorm of every row on the CPU (`Body.rmsnorm` in compiler/emitter.py): y[t, i] =
// x[t, i] * (1 / sqrt(mean_i(x[t, :]^2) + eps)) * w[i], as mlir/rmsnorm.mlir, whose sum of squares
// IREE compiles as one chain of scalar adds (576 of them per SmolLM2 row, each waiting for the one
// before). A dispatch written by hand, one workgroup per row: lane l of 16 sums x[i]^2 over
// i = l, l + 16, l + 32, ... (a multiply-add per 16 elements), the 16 lane sums are added as a
// tree, then each element is scaled as in the linalg form (x * scale, then * w). Every row goes
// through the same operations whatever the number of rows. Placeholders: NAME, D (a multiple of
// 16), C (D / 16), DF (D as f32), EPS.
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups(%t: index) -> (index, index, index) {
    %c1 = arith.constant 1 : index
    stream.return %t, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(%b_x: !stream.binding, %b_w: !stream.binding, %b_y: !stream.binding, %t: index) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c16 = arith.constant 16 : index
      %cC = arith.constant ${C} : index
      %x = stream.binding.subspan %b_x[%c0] : !stream.binding -> memref<?x${D}xf32>{%t}
      %w = stream.binding.subspan %b_w[%c0] : !stream.binding -> memref<${D}xf32>
      %y = stream.binding.subspan %b_y[%c0] : !stream.binding -> memref<?x${D}xf32>{%t}
      %row = stream.dispatch.workgroup.id[0] : index
      %zero = arith.constant dense<0.0> : vector<16xf32>
      %sq = scf.for %c = %c0 to %cC step %c1 iter_args(%acc = %zero) -> (vector<16xf32>) {
        %off = arith.muli %c, %c16 : index
        %v = vector.load %x[%row, %off] : memref<?x${D}xf32>, vector<16xf32>
        %next = math.fma %v, %v, %acc : vector<16xf32>
        scf.yield %next : vector<16xf32>
      }
      %s = vector.reduction <add>, %sq fastmath<reassoc> : vector<16xf32> into f32
      %n = arith.constant ${DF} : f32
      %eps = arith.constant ${EPS} : f32
      %one = arith.constant 1.0 : f32
      %mean = arith.divf %s, %n : f32
      %var = arith.addf %mean, %eps : f32
      %root = math.sqrt %var : f32
      %scale = arith.divf %one, %root : f32
      %scv = vector.broadcast %scale : f32 to vector<16xf32>
      scf.for %c = %c0 to %cC step %c1 {
        %off = arith.muli %c, %c16 : index
        %v = vector.load %x[%row, %off] : memref<?x${D}xf32>, vector<16xf32>
        %wv = vector.load %w[%off] : memref<${D}xf32>, vector<16xf32>
        %a = arith.mulf %v, %scv : vector<16xf32>
        %b = arith.mulf %a, %wv : vector<16xf32>
        vector.store %b, %y[%row, %off] : memref<?x${D}xf32>, vector<16xf32>
      }
      return
    }
  }
}
func.func private @${NAME}(%x: tensor<?x${D}xf32>, %w: tensor<${D}xf32>) -> tensor<?x${D}xf32> {
  %c0 = arith.constant 0 : index
  %t = tensor.dim %x, %c0 : tensor<?x${D}xf32>
  %y = flow.dispatch @${NAME}_ex::@${NAME}[%t](%x, %w, %t) : (tensor<?x${D}xf32>{%t}, tensor<${D}xf32>, index) -> tensor<?x${D}xf32>{%t}
  return %y : tensor<?x${D}xf32>
}
