// Greedy sampling of every row on the device: the index of each row's largest logit (the first
// one on exact ties). x [T, V] -> [T] i32.
func.func private @${NAME}(%x: tensor<?x${V}xf32>) -> tensor<?xi32> {
  %c0 = arith.constant 0 : index
  %T = tensor.dim %x, %c0 : tensor<?x${V}xf32>
  %ninf = arith.constant 0xFF800000 : f32
  %z = arith.constant 0 : i32
  %em = tensor.empty(%T) : tensor<?xf32>
  %m0 = linalg.fill ins(%ninf : f32) outs(%em : tensor<?xf32>) -> tensor<?xf32>
  %ei = tensor.empty(%T) : tensor<?xi32>
  %i0 = linalg.fill ins(%z : i32) outs(%ei : tensor<?xi32>) -> tensor<?xi32>
  %r:2 = linalg.generic {indexing_maps = [affine_map<(t, v) -> (t, v)>, affine_map<(t, v) -> (t)>, affine_map<(t, v) -> (t)>],
      iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<?x${V}xf32>) outs(%m0, %i0 : tensor<?xf32>, tensor<?xi32>) {
    ^bb0(%a: f32, %m: f32, %i: i32):
      %v = linalg.index 1 : index
      %vi = arith.index_cast %v : index to i32
      %gt = arith.cmpf ogt, %a, %m : f32
      %nm = arith.select %gt, %a, %m : f32
      %ni = arith.select %gt, %vi, %i : i32
      linalg.yield %nm, %ni : f32, i32
  } -> (tensor<?xf32>, tensor<?xi32>)
  return %r#1 : tensor<?xi32>
}
