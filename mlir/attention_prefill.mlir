// Prefill attention for the CPU (compiler/attention_prefill.py): T new tokens of one sequence at
// positions start + t, over its keys and values by position (row s is position s: the cached rows
// and this step's), causal, with a sliding window (WINDOW is huge where there is none), written by
// hand as a flash attention: no [T, S] score matrix is ever stored. Workgroup w takes R rows
// tb = (w % NRB) * R .. and one query head h = w / NRB of KV head g = h / G (NRB = ceil(T / R)
// row blocks: consecutive workgroups share a head, and its keys and values stay in the caches). It walks the
// positions BW at a time from the first row's window to the last row's own position; each block's
// scores come from kt [HKV, S / BW, HD, BW] (K in blocks of BW positions, a block's tile
// contiguous: read in order, one vector load per element of the head) times q one element at a
// time (an FMA with the element broadcast, ACC partial sums per row so the FMAs do not wait on each
// other), and each row keeps an online softmax (running max m, denominator l, weighted sum acc of
// the v rows). Scores are raw dot products; SCALE is applied inside the exponentials, as the linalg
// form does. m starts finite (-1e30), so a block the row cannot see leaves l and acc at 0. A row's
// result depends only on its position and the keys, never on T or on the other rows, so a position
// gets the same result bit for bit however its prompt was split into calls. S is a multiple of BW
// (ctx is padded so), so no load runs past the end. Rows past T (the last block's) are computed
// on the last row and not stored.
// Placeholders: NAME, HEADS, G, HKV, HD, HHD, R, R1 (R - 1), BW, BW1 (BW - 1), IOTA (0, .., BW - 1), ACC, WINDOW, SCALE, ROWS (per row: its
// clamped index, position and masks' operands), ITER_INIT, ITER_TYPES, NRES, NDOT (R x ACC), DOT_INIT, DOT_TYPES,
// DOT (the FMAs of ACC elements of q), DOT_YIELD, SOFTMAX, VALUES, YIELD, STORES.
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups(%tw: index) -> (index, index, index) {
    %cr1 = arith.constant ${R1} : index
    %cr = arith.constant ${R} : index
    %ch = arith.constant ${HEADS} : index
    %c1 = arith.constant 1 : index
    %tr = arith.addi %tw, %cr1 : index
    %nb = arith.divui %tr, %cr : index
    %x = arith.muli %nb, %ch : index
    stream.return %x, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(%b_q: !stream.binding, %b_kt: !stream.binding, %b_v: !stream.binding,
                       %b_y: !stream.binding, %tn: index, %sn: index, %start: index) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %cbw1 = arith.constant ${BW1} : index
      %cbw = arith.constant ${BW} : index
      %q = stream.binding.subspan %b_q[%c0] : !stream.binding -> memref<?x${HHD}xf32>{%tn}
      %snb = arith.divui %sn, %cbw : index
      %kt = stream.binding.subspan %b_kt[%c0] : !stream.binding -> memref<${HKV}x?x${HD}x${BW}xf32>{%snb}
      %v = stream.binding.subspan %b_v[%c0] : !stream.binding -> memref<?x${HKV}x${HD}xf32>{%sn}
      %y = stream.binding.subspan %b_y[%c0] : !stream.binding -> memref<?x${HHD}xf32>{%tn}
      %id = stream.dispatch.workgroup.id[0] : index
      %crm = arith.constant ${R1} : index
      %crb = arith.constant ${R} : index
      %tnr = arith.addi %tn, %crm : index
      %nrb = arith.divui %tnr, %crb : index
      %h = arith.divui %id, %nrb : index
      %rb = arith.remui %id, %nrb : index
      %cg = arith.constant ${G} : index
      %g = arith.divui %h, %cg : index
      %chd = arith.constant ${HD} : index
      %qoff = arith.muli %h, %chd : index
      %cr = arith.constant ${R} : index
      %tb = arith.muli %rb, %cr : index
      %tlast = arith.subi %tn, %c1 : index
      %scale = arith.constant ${SCALE} : f32
      %scv = vector.broadcast %scale : f32 to vector<${BW}xf32>
      %zero = arith.constant 0.0 : f32
      %zbw = arith.constant dense<0.0> : vector<${BW}xf32>
      %zhd = arith.constant dense<0.0> : vector<${HD}xf32>
      %mstart = arith.constant -1.0e+30 : f32
      %ninf = arith.constant dense<0xFF800000> : vector<${BW}xf32>
      %iota = arith.constant dense<[${IOTA}]> : vector<${BW}xi32>
      %win = arith.constant dense<${WINDOW}> : vector<${BW}xi32>
      %zi = arith.constant dense<0> : vector<${BW}xi32>
${ROWS}
      // positions lb..ub-1: from the first row's window (whole blocks) to the last row's position
      %cwin = arith.constant ${WINDOW} : index
      %pf1 = arith.addi %qp0, %c1 : index
      %far = arith.cmpi ugt, %pf1, %cwin : index
      %lbw = arith.subi %pf1, %cwin : index
      %lbs = arith.select %far, %lbw, %c0 : index
      %lbb = arith.divui %lbs, %cbw : index
      %lb = arith.muli %lbb, %cbw : index
      %pe = arith.addi %qp${R1}, %c1 : index
      %pebw1 = arith.addi %pe, %cbw1 : index
      %peb = arith.divui %pebw1, %cbw : index
      %pebw = arith.muli %peb, %cbw : index
      %ub = arith.minui %pebw, %sn : index
      %res:${NRES} = scf.for %s0 = %lb to %ub step %cbw iter_args(${ITER_INIT}) -> (${ITER_TYPES}) {
        %sb = arith.divui %s0, %cbw : index
        %cacc = arith.constant ${ACC} : index
        %dot:${NDOT} = scf.for %d = %c0 to %chd step %cacc iter_args(${DOT_INIT}) -> (${DOT_TYPES}) {
${DOT}
          scf.yield ${DOT_YIELD} : ${DOT_TYPES}
        }
        %s0i = arith.index_cast %s0 : index to i32
        %s0v = vector.broadcast %s0i : i32 to vector<${BW}xi32>
        %posv = arith.addi %s0v, %iota : vector<${BW}xi32>
${SOFTMAX}
${VALUES}
        scf.yield ${YIELD} : ${ITER_TYPES}
      }
${STORES}
      return
    }
  }
}
