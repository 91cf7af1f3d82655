// RUN: int8attn compile %s --target gfx936 --emit kernel -o - | filecheck %s

// Causal prefill with history: 128 new tokens ending a 4096-token sequence,
// 32 query heads over 8 KV heads (GQA 4:1), D = 128. The KV head's 512 rows
// are (token, head) pairs, token-major; a workgroup takes 64 of them (8 row
// blocks) and walks the 64-token tiles its last row can see.
// CHECK-LABEL: stream.executable private @prefill_attention
// CHECK: workgroups(%[[R:.*]]: index, %[[H:.*]]: index, %[[B:.*]]: index) -> (index, index, index)
// CHECK: stream.return %[[R]], %[[H]], %[[B]] : index, index, index
// CHECK: func.func @prefill_attention
// The workgroup's rows quantized once into LDS; W never goes there (its C registers
// are PV's A registers: fragments/score_feed.py).
// CHECK: memref.alloc() alignment = 16 : memref<64x128xi8, #gpu.address_space<workgroup>>
// CHECK: memref.alloc() alignment = 16 : memref<64xf32, #gpu.address_space<workgroup>>
// CHECK-NOT: memref.alloc() alignment = 16 : memref<4x16x64xi8
// CHECK: %[[Q:.*]] = stream.binding.subspan %arg0[%{{.*}}] : !stream.binding -> memref<1x32x128x128xf32>
// CHECK: %[[K:.*]] = stream.binding.subspan %arg1[%{{.*}}] : !stream.binding -> memref<1x8x4096x128xi8>
// CHECK: %[[OUT:.*]] = stream.binding.subspan %arg5[%{{.*}}] : !stream.binding -> memref<1x32x128x128xf32>
// Row r of the KV head is query token r / 4, head r % 4.
// CHECK: arith.divui %{{.*}}, %c4 : index
// CHECK: arith.remui %{{.*}}, %c4 : index
// CHECK: gpu.barrier
// The tile bounds (contract.causal_last_key): the block's first row (query token
// min(64 * block, 511) / 4) sees floor((S - Sq + 1 + its token) / 64) tiles whole; its
// last row sees ceil((S - Sq + 1 + its token) / 64) tiles.
// CHECK: %[[BLOCK_END:.*]] = arith.addi %{{.*}}, %c63 : index
// CHECK: %[[LAST:.*]] = arith.minui %[[BLOCK_END]], %c511 : index
// CHECK: %[[TOKEN:.*]] = arith.divui %[[LAST]], %c4 : index
// CHECK: %[[WHOLE_END:.*]] = arith.addi %{{.*}}, %c3969 : index
// CHECK: %[[WHOLE:.*]] = arith.divui %[[WHOLE_END]], %c64 : index
// CHECK: %[[SEEN:.*]] = arith.addi %[[TOKEN]], %c4032 : index
// CHECK: %[[TILES:.*]] = arith.divui %[[SEEN]], %c64 : index
// The tiles every row sees whole first, with no causal mask at all; then the rest,
// from where that loop ended, under the mask. One row class per lane in the gfx936 C
// layout: (m, l) and 32 o elements carried.
// CHECK: %[[WHOLE_LOOP:.*]]:34 = scf.for %{{.*}} = %c0 to %[[WHOLE]] step %c1 iter_args(
// CHECK-NOT: arith.cmpi ule
// CHECK: scf.yield
// CHECK: %[[LOOP:.*]]:34 = scf.for %[[T:[a-z0-9_]+]] = %[[WHOLE]] to %[[TILES]] step %c1 iter_args(%[[M:[a-z0-9_]+]] = %[[WHOLE_LOOP]]#0, %[[L:[a-z0-9_]+]] = %[[WHOLE_LOOP]]#1, %[[O0:[a-z0-9_]+]] = %[[WHOLE_LOOP]]#2
// CHECK: %[[FIRST:.*]] = arith.muli %[[T]], %c64 : index
// CHECK: vector.load %[[K]][%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}] alignment = 16 : memref<1x8x4096x128xi8>, vector<16xi8>
// QK: 2 q terms x 4 token blocks x 4 K steps (each term an MMAC of its own: every
// row of the tile is a query row).
// CHECK-COUNT-32: llvm.call_intrinsic "llvm.amdgcn.mmac.i32.16x16x32i8"
// The causal mask (contract.causal_visible): key <= S - Sq + the row's query token.
// CHECK: %[[LIMIT:.*]] = arith.addi %{{.*}}, %c3968 : index
// CHECK: arith.cmpi ule, %{{.*}}, %[[LIMIT]] : index
// The online softmax: tile max over the row (xor 16, 32), m' = max(m, .), guarded alpha.
// CHECK: gpu.shuffle xor %{{.*}}, %c16_i32, %c64_i32 : f32
// CHECK: gpu.shuffle xor %{{.*}}, %c32_i32, %c64_i32 : f32
// CHECK: %[[MNEW:.*]] = arith.maximumf %[[M]], %{{.*}} : f32
// CHECK: %[[DEAD:.*]] = arith.cmpf oeq, %[[MNEW]], %cst{{.*}} : f32
// CHECK: %[[DIFF:.*]] = arith.subf %[[M]], %[[MNEW]] : f32
// CHECK: %[[EXP:.*]] = llvm.call_intrinsic "llvm.exp2.f32"(%[[DIFF]]) : (f32) -> f32
// CHECK: %[[ALPHA:.*]] = arith.select %[[DEAD]], %cst{{.*}}, %[[EXP]] : f32
// l' = alpha l + the sum of p over the lane's own tokens of the row: no shuffle.
// CHECK-NOT: gpu.shuffle
// CHECK: %[[LSCALED:.*]] = arith.mulf %[[ALPHA]], %[[L]] : f32
// CHECK: %[[LNEW:.*]] = arith.addf %[[LSCALED]], %{{.*}} : f32
// The tile's PV goes on from alpha o (the contract's chain); the row's 32 products
// under a branch on alpha != 1 (1 * o is o bitwise; une: a NaN alpha multiplies).
// CHECK: %[[MOVED:.*]] = arith.cmpf une, %[[ALPHA]], %cst{{.*}} : f32
// CHECK: %[[OSCALED:.*]]:32 = scf.if %[[MOVED]] -> (f32,
// CHECK-NEXT: arith.mulf %[[ALPHA]], %[[O0]] : f32
// CHECK: } else {
// CHECK-NEXT: scf.yield %[[O0]],
// W quantized per (row, MMAC group) into PV's A operands in registers, then PV:
// 2 W digits x 2 MMACs x 8 head-dim tiles, no barrier in the tile loop. The levels
// are packed four to a word (Lanes.pack_bytes), an MMAC's 8 bytes taken as one i64.
// CHECK-NOT: gpu.barrier
// CHECK: %[[WORDS:.*]] = vector.from_elements %{{.*}}, %{{.*}} : vector<2xi32>
// CHECK: vector.bitcast %[[WORDS]] : vector<2xi32> to vector<1xi64>
// The first head-dim tile's 4 MMACs, then its elements' chains:
// o' = alpha o + sum_g f32(acc_g) sW_g, one FMA per MMAC group into alpha o.
// CHECK-COUNT-4: llvm.call_intrinsic "llvm.amdgcn.mmac.i32.16x16x32i8"
// CHECK: %[[O1:.*]] = math.fma %{{.*}}, %{{.*}}, %[[OSCALED]]#0 : f32
// CHECK-NEXT: %[[ONEW:.*]] = math.fma %{{.*}}, %{{.*}}, %[[O1]] : f32
// CHECK-COUNT-28: llvm.call_intrinsic "llvm.amdgcn.mmac.i32.16x16x32i8"
// CHECK-NOT: llvm.call_intrinsic
// CHECK-NOT: gpu.barrier
// CHECK: scf.yield %[[MNEW]], %[[LNEW]], %[[ONEW]],
// The loop carried each lane's partial l of its row: the row's 4 lanes (lane bits 4
// and 5) add theirs once, here; then the real rows store O = o / l into [B, Hq, Sq, D].
// CHECK: %[[LOTHER:.*]], %{{.*}} = gpu.shuffle xor %[[LOOP]]#1, %c16_i32, %c64_i32 : f32
// CHECK-NEXT: %[[LPAIR:.*]] = arith.addf %[[LOOP]]#1, %[[LOTHER]] : f32
// CHECK-NEXT: %[[LREST:.*]], %{{.*}} = gpu.shuffle xor %[[LPAIR]], %c32_i32, %c64_i32 : f32
// CHECK-NEXT: %[[LROW:.*]] = arith.addf %[[LPAIR]], %[[LREST]] : f32
// CHECK: %[[REAL:.*]] = arith.cmpi ult, %{{.*}}, %c512 : index
// CHECK: scf.if %[[REAL]] {
// CHECK: %[[QTOKEN:.*]] = arith.divui %{{.*}}, %c4 : index
// CHECK: arith.divf %[[LOOP]]#2, %[[LROW]] : f32
// CHECK: memref.store %{{.*}}, %[[OUT]][%{{.*}}, %{{.*}}, %[[QTOKEN]], %{{.*}}] : memref<1x32x128x128xf32>
// The host: V transposed to token-innermost, one dispatch over (8 row blocks, 8 KV heads, 1).
// CHECK-LABEL: func.func @prefill(
// CHECK: %[[VT:.*]] = linalg.transpose
// CHECK: flow.dispatch @prefill_attention::@prefill_attention[%c8, %c8, %c1](%arg0, %arg1, %arg2, %[[VT]], %arg4)
func.func @prefill(%q: tensor<1x32x128x128xf32>,
                   %k: tensor<1x8x4096x128xi8>, %k_scale: tensor<1x8x4096xf32>,
                   %v: tensor<1x8x4096x128xi8>, %v_scale: tensor<1x8x4096xf32>)
    -> tensor<1x32x128x128xf32> {
  %o = "int8attn.attention"(%q, %k, %k_scale, %v, %v_scale)
      {mode = "prefill", softmax_scale = 0.08838834764831845 : f32}
      : (tensor<1x32x128x128xf32>, tensor<1x8x4096x128xi8>, tensor<1x8x4096xf32>,
         tensor<1x8x4096x128xi8>, tensor<1x8x4096xf32>) -> tensor<1x32x128x128xf32>
  return %o : tensor<1x32x128x128xf32>
}
