// Prefill attention for the CPU (compiler/attention_prefill.py): T new tokens of one sequence at
// positions start + t, over its keys and values by position (row s is position s: the cached rows
// and this step's), causal, with a sliding window (WINDOW is huge where there is none), written by
// hand as a flash attention: no [T, S] score matrix is ever stored.
// Workgroup w takes R rows tb = (w % NRB) * R .. of GQ query heads h0 = (w / NRB) * GQ .. of KV
// head g (NRB = ceil(T / R): consecutive workgroups share heads, and their keys and values stay in
// the caches). Its vectors run across L = R * GQ lanes, lane m row tb + m / GQ of head
// h0 + m % GQ: for each block of BW positions (from the first row's window to the last row's
// position) the scores s[j] are sums over the head of qt[w / NRB, d, lanes] times kt[g, s0 / BW,
// d, j] broadcast, one FMA per (j, d) in a register of JB sums; the online softmax (running max m,
// denominator l) then takes a few vector ops per position for all the lanes at once; the
// probabilities p[j] weigh the v rows into ot [HD, L], DC dims at a time. Scores are raw dot
// products; SCALE is applied inside the exponentials. m starts finite (-1e30), so a block a lane
// cannot see leaves its l and sums unchanged bit for bit: a row's result depends only on its
// position and the keys, never on T or the other rows, and a prompt split into calls gives the
// same bits. S is a multiple of BW (ctx is padded so), so no load runs past the end; lanes of
// rows past T compute the last row's position on zero queries and are not stored.
// Placeholders: NAME, NHG (heads / GQ), GQ, GG (G / GQ), HKV, HD, HHD, L, R, R1 (R - 1), BW,
// BW1 (BW - 1), DC, LROW (each lane's row in the block), WINDOW, SCALE, QK (the score passes),
// SOFTMAX, PV (the weighted sums of one DC chunk), OUT (L dims of the lanes' results, from ot's
// lanes to y's rows).
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups(%tw: index) -> (index, index, index) {
    %cr1 = arith.constant ${R1} : index
    %cr = arith.constant ${R} : index
    %ch = arith.constant ${NHG} : index
    %c1 = arith.constant 1 : index
    %tr = arith.addi %tw, %cr1 : index
    %nb = arith.divui %tr, %cr : index
    %x = arith.muli %nb, %ch : index
    stream.return %x, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(%b_q: !stream.binding, %b_k: !stream.binding, %b_v: !stream.binding,
                       %b_y: !stream.binding, %tn: index, %sn: index, %start: index) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %cbw = arith.constant ${BW} : index
      %cbw1 = arith.constant ${BW1} : index
      %cl = arith.constant ${L} : index
      %cr = arith.constant ${R} : index
      %cr1 = arith.constant ${R1} : index
      %cgq = arith.constant ${GQ} : index
      %chd = arith.constant ${HD} : index
      %cdc = arith.constant ${DC} : index
      %tgq = arith.muli %tn, %cgq : index
      %qt = stream.binding.subspan %b_q[%c0] : !stream.binding -> memref<${NHG}x${HD}x?xf32>{%tgq}
      %snb = arith.divui %sn, %cbw : index
      %kt = stream.binding.subspan %b_k[%c0] : !stream.binding -> memref<${HKV}x?x${HD}x${BW}xf32>{%snb}
      %vt = stream.binding.subspan %b_v[%c0] : !stream.binding -> memref<${HKV}x?x${HD}xf32>{%sn}
      %y = stream.binding.subspan %b_y[%c0] : !stream.binding -> memref<?x${HHD}xf32>{%tn}
      %ot = memref.alloca() : memref<${HD}x${L}xf32>
      %id = stream.dispatch.workgroup.id[0] : index
      %tnr = arith.addi %tn, %cr1 : index
      %nrb = arith.divui %tnr, %cr : index
      %hg = arith.divui %id, %nrb : index
      %rb = arith.remui %id, %nrb : index
      %cgg = arith.constant ${GG} : index
      %g = arith.divui %hg, %cgg : index
      %h0 = arith.muli %hg, %cgq : index
      %qoff = arith.muli %h0, %chd : index
      %tb = arith.muli %rb, %cr : index
      %tbq = arith.muli %tb, %cgq : index
      %tlast = arith.subi %tn, %c1 : index
      %scale = arith.constant ${SCALE} : f32
      %scv = vector.broadcast %scale : f32 to vector<${L}xf32>
      %zl = arith.constant dense<0.0> : vector<${L}xf32>
      %mstart = arith.constant dense<-1.0e+30> : vector<${L}xf32>
      %ninf = arith.constant dense<0xFF800000> : vector<${L}xf32>
      %one = arith.constant dense<1.0> : vector<${L}xf32>
      %c0f = arith.constant 0.0 : f32
      %lrow = arith.constant dense<[${LROW}]> : vector<${L}xi32>
      %win = arith.constant dense<${WINDOW}> : vector<${L}xi32>
      // each lane's row (clamped to the last) and position; lanes past T load zero queries
      %tbi = arith.index_cast %tb : index to i32
      %tbv = vector.broadcast %tbi : i32 to vector<${L}xi32>
      %rows = arith.addi %tbv, %lrow : vector<${L}xi32>
      %tli = arith.index_cast %tlast : index to i32
      %tlv = vector.broadcast %tli : i32 to vector<${L}xi32>
      %inq = arith.cmpi sle, %rows, %tlv : vector<${L}xi32>
      %rowc = arith.minsi %rows, %tlv : vector<${L}xi32>
      %sti = arith.index_cast %start : index to i32
      %stv = vector.broadcast %sti : i32 to vector<${L}xi32>
      %qpv = arith.addi %stv, %rowc : vector<${L}xi32>
      scf.for %d = %c0 to %chd step %c1 {
        vector.store %zl, %ot[%d, %c0] : memref<${HD}x${L}xf32>, vector<${L}xf32>
      }
      // positions lb..ub-1: from the first row's window (whole blocks) to the last row's position
      %qp0 = arith.addi %start, %tb : index
      %tbl = arith.addi %tb, %cr1 : index
      %tl = arith.minui %tbl, %tlast : index
      %qpl = arith.addi %start, %tl : index
      %cwin = arith.constant ${WINDOW} : index
      %pf1 = arith.addi %qp0, %c1 : index
      %far = arith.cmpi ugt, %pf1, %cwin : index
      %lbw = arith.subi %pf1, %cwin : index
      %lbs = arith.select %far, %lbw, %c0 : index
      %lbb = arith.divui %lbs, %cbw : index
      %lb = arith.muli %lbb, %cbw : index
      %pe = arith.addi %qpl, %c1 : index
      %pebw1 = arith.addi %pe, %cbw1 : index
      %peb = arith.divui %pebw1, %cbw : index
      %pebw = arith.muli %peb, %cbw : index
      %ub = arith.minui %pebw, %sn : index
      %res:2 = scf.for %s0 = %lb to %ub step %cbw iter_args(%m = %mstart, %l = %zl)
          -> (vector<${L}xf32>, vector<${L}xf32>) {
${QK}
${SOFTMAX}
        scf.for %dc = %c0 to %chd step %cdc {
${PV}
        }
        scf.yield %mn, %l2 : vector<${L}xf32>, vector<${L}xf32>
      }
      %inv = arith.divf %one, %res#1 : vector<${L}xf32>
      scf.for %dc = %c0 to %chd step %cl {
${OUT}
      }
      return
    }
  }
}
