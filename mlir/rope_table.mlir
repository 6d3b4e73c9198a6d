// RoPE's angles for one step, computed once and read by every layer's rope (rope_norm/rope_neox):
// cs[t, i] = cos(theta), sn[t, i] = sin(theta), theta = (start + t) * FREQ_SCALE * BASE^(i * NEG2_OVER_NR)
// for pair i of a head (NEG2_OVER_NR = -2/n_rot). In a batch of sequences each row has its own
// position: POS_ARG/POS_EXPR read it from %pos (IN_MAP/INS/IN_ARG). %T is the step's token count.
// The table is its own dispatch region: as a plain linalg op with no tensor input, IREE would
// clone its math into every rope dispatch (and, being cheap to clone, recompute it there).
func.func private @${NAME}(${POS_ARG}, %T: index) -> (tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>) {
  %r:2 = flow.dispatch.region -> (tensor<${T}x${P}xf32>${DIMS}, tensor<${T}x${P}xf32>${DIMS}) {
    %e = tensor.empty(${DYN}) : tensor<${T}x${P}xf32>
    %g:2 = linalg.generic {indexing_maps = [${IN_MAP}affine_map<(t, i) -> (t, i)>, affine_map<(t, i) -> (t, i)>],
        iterator_types = ["parallel", "parallel"]}
        ${INS}outs(%e, %e : tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>) {
      ^bb0(${IN_ARG}%o0: f32, %o1: f32):
        %t = linalg.index 0 : index
        %i = linalg.index 1 : index
        ${POS_EXPR}
        %pi = arith.index_cast %p : index to i64
        %pf0 = arith.sitofp %pi : i64 to f32
        %fs = arith.constant ${FREQ_SCALE} : f32
        %pf = arith.mulf %pf0, %fs : f32
        %ii = arith.index_cast %i : index to i64
        %if = arith.sitofp %ii : i64 to f32
        %k = arith.constant ${NEG2_OVER_NR} : f32
        %ex = arith.mulf %if, %k : f32
        %base = arith.constant ${BASE} : f32
        %fr = math.powf %base, %ex : f32
        %th = arith.mulf %pf, %fr : f32
        %cs = math.cos %th : f32
        %sn = math.sin %th : f32
        linalg.yield %cs, %sn : f32, f32
    } -> (tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>)
    flow.return %g#0, %g#1 : tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>
  }
  return %r#0, %r#1 : tensor<${T}x${P}xf32>, tensor<${T}x${P}xf32>
}
