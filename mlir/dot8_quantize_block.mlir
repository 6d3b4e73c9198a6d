// One 32-block of one activation row quantized to int8 as llama.cpp's Q8_0/Q8_1 (compiler/dot8.py):
// d = max|x| / 127, q = round-to-even(x * (127 / max|x|)) with vcvtps2dq, s = d * sum q. Inside the
// loops over rows and blocks (%b) of a dot8 kernel or of its activation quantizer; needs %c0,
// %fzero and %fmax. Placeholders: X_ROW and Q_ROW (the row of %x read, and of %xq, %dx, %sx
// written), XM (the type of %x), XQ and DX (the types of %xq, and of %dx and %sx).
        %v = vector.load %x[${X_ROW}, %b, %c0] : memref<${XM}>, vector<32xf32>
        %av = math.absf %v : vector<32xf32>
        %ab = arith.bitcast %av : vector<32xf32> to vector<32xi32>
        %mb = vector.reduction <maxui>, %ab : vector<32xi32> into i32
        %mx = arith.bitcast %mb : i32 to f32
        %d = arith.divf %mx, %fmax : f32
        %nz = arith.cmpf ogt, %mx, %fzero : f32
        %inv0 = arith.divf %fmax, %mx : f32
        %inv = arith.select %nz, %inv0, %fzero : f32
        %invv = vector.broadcast %inv : f32 to vector<32xf32>
        %sc = arith.mulf %v, %invv : vector<32xf32>
        %s4 = vector.shape_cast %sc : vector<32xf32> to vector<4x8xf32>
        %s0 = vector.extract %s4[0] : vector<8xf32> from vector<4x8xf32>
        %s1 = vector.extract %s4[1] : vector<8xf32> from vector<4x8xf32>
        %s2 = vector.extract %s4[2] : vector<8xf32> from vector<4x8xf32>
        %s3 = vector.extract %s4[3] : vector<8xf32> from vector<4x8xf32>
        %q0 = llvm.call_intrinsic "llvm.x86.avx.cvt.ps2dq.256"(%s0) : (vector<8xf32>) -> vector<8xi32>
        %q1 = llvm.call_intrinsic "llvm.x86.avx.cvt.ps2dq.256"(%s1) : (vector<8xf32>) -> vector<8xi32>
        %q2 = llvm.call_intrinsic "llvm.x86.avx.cvt.ps2dq.256"(%s2) : (vector<8xf32>) -> vector<8xi32>
        %q3 = llvm.call_intrinsic "llvm.x86.avx.cvt.ps2dq.256"(%s3) : (vector<8xf32>) -> vector<8xi32>
        %z4 = arith.constant dense<0> : vector<4x8xi32>
        %i0 = vector.insert %q0, %z4[0] : vector<8xi32> into vector<4x8xi32>
        %i1 = vector.insert %q1, %i0[1] : vector<8xi32> into vector<4x8xi32>
        %i2 = vector.insert %q2, %i1[2] : vector<8xi32> into vector<4x8xi32>
        %i3 = vector.insert %q3, %i2[3] : vector<8xi32> into vector<4x8xi32>
        %qw = vector.shape_cast %i3 : vector<4x8xi32> to vector<32xi32>
        %qi = arith.trunci %qw : vector<32xi32> to vector<32xi8>
        vector.store %qi, %xq[${Q_ROW}, %b, %c0] : memref<${XQ}>, vector<32xi8>
        %p01 = arith.addi %q0, %q1 : vector<8xi32>
        %p23 = arith.addi %q2, %q3 : vector<8xi32>
        %p03 = arith.addi %p01, %p23 : vector<8xi32>
        %qsum = vector.reduction <add>, %p03 : vector<8xi32> into i32
        %qsf = arith.sitofp %qsum : i32 to f32
        %sd = arith.mulf %qsf, %d : f32
        memref.store %d, %dx[${Q_ROW}, %b] : memref<${DX}>
        memref.store %sd, %sx[${Q_ROW}, %b] : memref<${DX}>
