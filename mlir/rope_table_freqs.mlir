// RoPE's angles for one step when each pair has its own frequency (Llama 3.1/3.2's
// rope_freqs.weight divides pair i's frequency by a factor): rope_table.mlir with the frequencies
// as a constant, cs[t, i] = cos(theta), sn[t, i] = sin(theta), theta = (start + t) * FREQ_SCALE * FREQS[i].
// FREQS [P] (compiler/emitter.py `rope_freqs`) is theta_scale^i / factor[i] in f32, theta_scale =
// BASE^(-2/n_rot), rounded the way llama.cpp's CPU rope cache computes it. Positions, POS_ARG/POS_EXPR,
// IN_MAP/IN_ARG and %T as in rope_table.mlir; INS lists %pos (a batch of sequences) before FREQS.
func.func private @${NAME}(${POS_ARG}, %T: index) -> (tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>) {
  %r:2 = flow.dispatch.region -> (tensor<${T}x${P}xf32>${DIMS}, tensor<${T}x${P}xf32>${DIMS}) {
    %fq = arith.constant dense<${FREQS}> : tensor<${P}xf32>
    %e = tensor.empty(${DYN}) : tensor<${T}x${P}xf32>
    %g:2 = linalg.generic {indexing_maps = [${IN_MAP}affine_map<(t, i) -> (i)>, affine_map<(t, i) -> (t, i)>,
        affine_map<(t, i) -> (t, i)>], iterator_types = ["parallel", "parallel"]}
        ins(${INS}) outs(%e, %e : tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>) {
      ^bb0(${IN_ARG}%f: f32, %o0: f32, %o1: f32):
        %t = linalg.index 0 : index
        ${POS_EXPR}
        %pi = arith.index_cast %p : index to i64
        %pf0 = arith.sitofp %pi : i64 to f32
        %fs = arith.constant ${FREQ_SCALE} : f32
        %pf = arith.mulf %pf0, %fs : f32
        %th = arith.mulf %pf, %f : f32
        %cs = math.cos %th : f32
        %sn = math.sin %th : f32
        linalg.yield %cs, %sn : f32, f32
    } -> (tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>)
    flow.return %g#0, %g#1 : tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>
  }
  return %r#0, %r#1 : tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>
}
