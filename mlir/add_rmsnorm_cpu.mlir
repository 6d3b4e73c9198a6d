// The residual add and the RMSNorm after it, in one dispatch on the CPU (`Body.add_rmsnorm` in
// compiler/emitter.py): s[t, i] = x[t, i] + r[t, i], and y[t, i] = s[t, i] * (1 / sqrt(mean_i(s[t, :]^2)
// + eps)) * w[i], computed as mlir/rmsnorm_cpu.mlir computes it from s (one workgroup per row, the
// sum of squares in 16 lanes), so both outputs carry the bits of the add and the norm run apart.
// The second pass adds x and r again rather than read s back. Placeholders: NAME, D (a multiple
// of 16), C (D / 16), DF (D as f32), EPS.
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups(%t: index) -> (index, index, index) {
    %c1 = arith.constant 1 : index
    stream.return %t, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(%b_x: !stream.binding, %b_r: !stream.binding, %b_w: !stream.binding, %b_s: !stream.binding, %b_y: !stream.binding, %t: index) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c16 = arith.constant 16 : index
      %cC = arith.constant ${C} : index
      %x = stream.binding.subspan %b_x[%c0] : !stream.binding -> memref<?x${D}xf32>{%t}
      %r = stream.binding.subspan %b_r[%c0] : !stream.binding -> memref<?x${D}xf32>{%t}
      %w = stream.binding.subspan %b_w[%c0] : !stream.binding -> memref<${D}xf32>
      %s = stream.binding.subspan %b_s[%c0] : !stream.binding -> memref<?x${D}xf32>{%t}
      %y = stream.binding.subspan %b_y[%c0] : !stream.binding -> memref<?x${D}xf32>{%t}
      %row = stream.dispatch.workgroup.id[0] : index
      %zero = arith.constant dense<0.0> : vector<16xf32>
      %sq = scf.for %c = %c0 to %cC step %c1 iter_args(%acc = %zero) -> (vector<16xf32>) {
        %off = arith.muli %c, %c16 : index
        %xv = vector.load %x[%row, %off] : memref<?x${D}xf32>, vector<16xf32>
        %rv = vector.load %r[%row, %off] : memref<?x${D}xf32>, vector<16xf32>
        %v = arith.addf %xv, %rv : vector<16xf32>
        vector.store %v, %s[%row, %off] : memref<?x${D}xf32>, vector<16xf32>
        %next = math.fma %v, %v, %acc : vector<16xf32>
        scf.yield %next : vector<16xf32>
      }
      %sum = vector.reduction <add>, %sq fastmath<reassoc> : vector<16xf32> into f32
      %n = arith.constant ${DF} : f32
      %eps = arith.constant ${EPS} : f32
      %one = arith.constant 1.0 : f32
      %mean = arith.divf %sum, %n : f32
      %var = arith.addf %mean, %eps : f32
      %root = math.sqrt %var : f32
      %scale = arith.divf %one, %root : f32
      %scv = vector.broadcast %scale : f32 to vector<16xf32>
      scf.for %c = %c0 to %cC step %c1 {
        %off = arith.muli %c, %c16 : index
        %xv = vector.load %x[%row, %off] : memref<?x${D}xf32>, vector<16xf32>
        %rv = vector.load %r[%row, %off] : memref<?x${D}xf32>, vector<16xf32>
        %v = arith.addf %xv, %rv : vector<16xf32>
        %wv = vector.load %w[%off] : memref<${D}xf32>, vector<16xf32>
        %a = arith.mulf %v, %scv : vector<16xf32>
        %b = arith.mulf %a, %wv : vector<16xf32>
        vector.store %b, %y[%row, %off] : memref<?x${D}xf32>, vector<16xf32>
      }
      return
    }
  }
}
func.func private @${NAME}(%x: tensor<?x${D}xf32>, %r: tensor<?x${D}xf32>, %w: tensor<${D}xf32>) -> (tensor<?x${D}xf32>, tensor<?x${D}xf32>) {
  %c0 = arith.constant 0 : index
  %t = tensor.dim %x, %c0 : tensor<?x${D}xf32>
  %s, %y = flow.dispatch @${NAME}_ex::@${NAME}[%t](%x, %r, %w, %t) : (tensor<?x${D}xf32>{%t}, tensor<?x${D}xf32>{%t}, tensor<${D}xf32>, index) -> (tensor<?x${D}xf32>{%t}, tensor<?x${D}xf32>{%t})
  return %s, %y : tensor<?x${D}xf32>, tensor<?x${D}xf32>
}
