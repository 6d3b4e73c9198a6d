// Decode attention for the CPU (compiler/attention_cpu.py): one new token per row, each row its own
// sequence, a dispatch written by hand. Workgroup w takes row t = w / NWG and PER query heads
// h = h0 + i from h0 = (w % NWG) * PER, all of KV head g = h0 / G (NWG = heads / PER): it reads
// each cached position's slot, K row and V row once for its heads (straight from the slot-major
// slab cache[ctx[t, s], layer, 0|1, g], one vector load each, 8 positions at a time, the rows
// AHEAD positions further prefetched) and keeps one online softmax per head (running max m,
// denominator l, weighted sum acc) that starts from the row's own new key and value, which are
// never masked, so m is always finite. Positions s >= len[t] and those WINDOW or more behind
// len[t] are masked; blocks past len[t] or wholly behind the window are not read at all (a masked
// block leaves m, l and acc as they were, bit for bit), so a row costs the same alone and in a
// batch. q is multiplied by SCALE before the dot products; each position's dot product is kept
// as 16 lane sums and the 8 positions' sums are finished together by a tree of shuffles. Each
// head's operations are those of a dispatch of its own, in the same order: the heads only share
// their loads.
// Placeholders: NAME, NWG, PER, G, HKV, HD, HHD, L, WINDOW, SCALE, DT (the slab's element type:
// f16 rows are widened to f32 as they are loaded), HEADS (per head: q loaded, scaled and cut into
// 16-lane pieces, the new key's score), WARM (the prefetches of the loop's first positions), NRES,
// ITER_INIT, ITER_TYPES, YIELD (m, l, acc of each head), KEYS (the 8 positions' slots and K rows,
// and the prefetches ahead), SCORES (per head: the 8 scores %sc_hI), SOFTMAX (per head: the
// block's probabilities %p_hI and the rescaled sum %a0_hI), VALUES (the 8 V rows and each head's
// sums), STORES (each head's output).
stream.executable private @${NAME}_ex {
  stream.executable.export public @${NAME} workgroups(%tw: index) -> (index, index, index) {
    %cnw = arith.constant ${NWG} : index
    %x = arith.muli %tw, %cnw : index
    %c1 = arith.constant 1 : index
    stream.return %x, %c1, %c1 : index, index, index
  }
  builtin.module {
    func.func @${NAME}(%b_q: !stream.binding, %b_cache: !stream.binding, %b_ctx: !stream.binding,
                       %b_kn: !stream.binding, %b_vn: !stream.binding, %b_len: !stream.binding,
                       %b_y: !stream.binding, %tn: index, %ns: index, %sn: index, %layer: index) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c7 = arith.constant 7 : index
      %c8 = arith.constant 8 : index
      %q = stream.binding.subspan %b_q[%c0] : !stream.binding -> memref<?x${HHD}xf32>{%tn}
      %cache = stream.binding.subspan %b_cache[%c0] : !stream.binding -> memref<?x${L}x2x${HKV}x${HD}x${DT}>{%ns}
      %ctx = stream.binding.subspan %b_ctx[%c0] : !stream.binding -> memref<?x?xi32>{%tn, %sn}
      %kn = stream.binding.subspan %b_kn[%c0] : !stream.binding -> memref<?x${HKV}x${HD}xf32>{%tn}
      %vn = stream.binding.subspan %b_vn[%c0] : !stream.binding -> memref<?x${HKV}x${HD}xf32>{%tn}
      %len = stream.binding.subspan %b_len[%c0] : !stream.binding -> memref<?xi32>{%tn}
      %y = stream.binding.subspan %b_y[%c0] : !stream.binding -> memref<?x${HHD}xf32>{%tn}
      %id = stream.dispatch.workgroup.id[0] : index
      %cnw = arith.constant ${NWG} : index
      %t = arith.divui %id, %cnw : index
      %jw = arith.remui %id, %cnw : index
      %cper = arith.constant ${PER} : index
      %h0 = arith.muli %jw, %cper : index
      %cg = arith.constant ${G} : index
      %g = arith.divui %h0, %cg : index
      %scale = arith.constant ${SCALE} : f32
      %scv = vector.broadcast %scale : f32 to vector<${HD}xf32>
      %knv = vector.load %kn[%t, %g, %c0] : memref<?x${HKV}x${HD}xf32>, vector<${HD}xf32>
      %vnv = vector.load %vn[%t, %g, %c0] : memref<?x${HKV}x${HD}xf32>, vector<${HD}xf32>
${HEADS}
      %n32 = memref.load %len[%t] : memref<?xi32>
      %n = arith.index_cast %n32 : i32 to index
      %n7 = arith.addi %n, %c7 : index
      %nb = arith.divui %n7, %c8 : index
      %n8 = arith.muli %nb, %c8 : index
      %ub = arith.minui %n8, %sn : index
      %slast = arith.subi %sn, %c1 : index
      %one = arith.constant 1.0 : f32
      %ninf = arith.constant dense<0xFF800000> : vector<8xf32>
      %iota = arith.constant dense<[0, 1, 2, 3, 4, 5, 6, 7]> : vector<8xi32>
      %nv = vector.broadcast %n32 : i32 to vector<8xi32>
      %win = arith.constant dense<${WINDOW}> : vector<8xi32>
      %cwin = arith.constant ${WINDOW} : index
      %n1 = arith.addi %n, %c1 : index
      %far = arith.cmpi ugt, %n1, %cwin : index
      %lbw = arith.subi %n1, %cwin : index
      %lbs = arith.select %far, %lbw, %c0 : index
      %lbb = arith.divui %lbs, %c8 : index
      %lb = arith.muli %lbb, %c8 : index
      %reads = arith.cmpi ult, %lb, %ub : index
      scf.if %reads {  // ctx has a column to read (the loop runs at least once)
${WARM}
      }
      %res:${NRES} = scf.for %s0 = %lb to %ub step %c8 iter_args(${ITER_INIT}) -> (${ITER_TYPES}) {
${KEYS}
${SCORES}
        %s0i = arith.index_cast %s0 : index to i32
        %s0v = vector.broadcast %s0i : i32 to vector<8xi32>
        %posv = arith.addi %s0v, %iota : vector<8xi32>
        %inside = arith.cmpi slt, %posv, %nv : vector<8xi32>
        %dist = arith.subi %nv, %posv : vector<8xi32>
        %near = arith.cmpi ult, %dist, %win : vector<8xi32>
        %ok = arith.andi %inside, %near : vector<8xi1>
${SOFTMAX}
${VALUES}
        scf.yield ${YIELD} : ${ITER_TYPES}
      }
${STORES}
      return
    }
  }
}
