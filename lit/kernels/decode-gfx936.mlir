// RUN: int8attn compile %s --target gfx936 --emit kernel -o - | filecheck %s
// RUN: int8attn compile %s --target gfx942 --emit kernel -o - | filecheck %s --check-prefix=GFX942

// Decode, 32 query heads over 8 KV heads, D = 128, 4096 tokens (16 partitions).
// Per wave: QK = 2 q terms x 4 token blocks x 4 K steps, PV = 2 W terms x 2 MMACs x
// 8 head-dim tiles (the kernels' default numerics; gfx936's C layout holds one row
// per lane, so no padding rows take the second terms: each is an MMAC of its own).
// The grid is the dispatch's workload (partitions, KV heads, batch); the
// host dispatches 16 partitions of 256 tokens. The query rows are quantized
// in the kernel; each partition stores its 4 real rows (GQA 4:1).
// CHECK-LABEL: stream.executable private @decode_partition
// CHECK: workgroups(%[[P:.*]]: index, %[[H:.*]]: index, %[[B:.*]]: index) -> (index, index, index)
// CHECK: stream.return %[[P]], %[[H]], %[[B]] : index, index, index
// CHECK: func.func @decode_partition
// CHECK-SAME: translation_info = #translation
// CHECK: stream.binding.subspan %{{.*}} -> memref<1x32x128xf32>
// CHECK: stream.binding.subspan %{{.*}} -> memref<1x8x16x4x128xf32>
// CHECK-COUNT-64: llvm.call_intrinsic "llvm.amdgcn.mmac.i32.16x16x32i8"(%{{.*}}, %{{.*}}, %{{.*}}) : (i64, i64, vector<4xi32>) -> vector<4xi32>
// CHECK-NOT: llvm.call_intrinsic
// The merge: first each row's max M over the partitions (the lanes of a wave
// stride over them, xor shuffles, LDS); then 4 groups of 256 threads, group g
// over partitions g, g+4, ... (here 16 partitions: the loop is unrolled away),
// each thread's 2 cells of one row read as one vector, one weight
// e^(m_p - M) l_p per (row, partition); the groups' sums meet in LDS and
// group 0 divides and stores.
// CHECK-LABEL: stream.executable private @decode_merge
// CHECK: stream.return %c1, %{{.*}}, %{{.*}} : index, index, index
// CHECK-NOT: llvm.call_intrinsic
// CHECK: %[[TOP:.*]] = memref.alloc() alignment = 16 : memref<16xf32, #gpu.address_space<workgroup>>
// CHECK: %[[SUMS:.*]] = memref.alloc() alignment = 16 : memref<4x3x256xf32, #gpu.address_space<workgroup>>
// CHECK: %[[TID:.*]] = gpu.thread_id x upper_bound 1024
// The group's first partitions' partials are loaded before the rows' max M (their
// loads need no M: one L2 round trip for both).
// CHECK: %[[HIGH:.*]] = arith.shrui %[[TID]], %c8 : index
// CHECK: %[[GROUP:.*]] = arith.andi %[[HIGH]], %c3 : index
// CHECK: %[[P:.*]] = arith.minui %[[GROUP]], %c15 : index
// CHECK: memref.load %{{.*}}[%{{.*}}, %{{.*}}, %[[P]], %{{.*}}] : memref<1x8x16x16xf32>
// CHECK: vector.load %{{.*}}[%{{.*}}, %{{.*}}, %[[P]], %{{.*}}, %{{.*}}] alignment = 8 : memref<1x8x16x4x128xf32>, vector<2xf32>
// CHECK: arith.maximumf
// CHECK: gpu.shuffle xor %{{.*}}, %c32_i32, %c64_i32 : f32
// CHECK: memref.store %{{.*}}, %[[TOP]][
// CHECK: gpu.barrier
// CHECK: memref.load %[[TOP]][
// Eight partition slots per thread (unroll 8), one exp each for its two cells.
// CHECK-COUNT-8: math.exp
// CHECK-NOT: math.exp
// CHECK: memref.store %{{.*}}, %[[SUMS]][%[[GROUP]],
// CHECK: gpu.barrier
// CHECK: %[[FIRST:.*]] = arith.cmpi eq, %[[GROUP]], %c0 : index
// CHECK: scf.if %[[FIRST]] {
// CHECK: arith.divf
// CHECK: vector.store %{{.*}} alignment = 8 : memref<1x8x4x128xf32>, vector<2xf32>
// CHECK-LABEL: func.func @decode(
// CHECK: %[[PART:.*]]:3 = flow.dispatch @decode_partition::@decode_partition[%{{.*}}, %{{.*}}, %{{.*}}](%arg0, %{{.*}})
// CHECK: flow.dispatch @decode_merge::@decode_merge[%{{.*}}, %{{.*}}](%[[PART]]#0, %[[PART]]#1, %[[PART]]#2)

// The W absmax per (row, MMAC): |W| maxed in-lane, then xor shuffles 16 and
// 32 over the four lanes that share a row in the gfx936 C "jump" layout.
// ABSMAX-LABEL: func.func @decode_partition
// ABSMAX: math.absf
// ABSMAX: %[[S16:.*]], %{{.*}} = gpu.shuffle xor %[[A:[^,]*]], %c16_i32, %c64_i32 : f32
// ABSMAX-NEXT: %[[M16:.*]] = arith.maximumf %[[A]], %[[S16]] : f32
// ABSMAX-NEXT: %[[S32:.*]], %{{.*}} = gpu.shuffle xor %[[M16]], %c32_i32, %c64_i32 : f32
// ABSMAX-NEXT: arith.maximumf %[[M16]], %[[S32]] : f32
// ABSMAX-NOT: gpu.shuffle xor %{{.*}}, %c1_i32
// (The merge's row max does shuffle over lanes 1, 2, ...)
// ABSMAX-LABEL: stream.executable private @decode_merge
// RUN: int8attn compile %s --target gfx936 --emit kernel -o - | filecheck %s --check-prefix=ABSMAX

// V is read 16 bytes per lane from the token-innermost cache [B, Hkv, D, S].
// VLOAD: func.func @decode_partition
// VLOAD-COUNT-8: vector.load %{{.*}} : memref<1x8x128x4096xi8>, vector<16xi8>
// VLOAD-NOT: vector<8xi8> from memref<1x8x128x4096xi8>
// RUN: int8attn compile %s --target gfx936 --emit kernel -o - | filecheck %s --check-prefix=VLOAD

// gfx942: same generator, MFMA C layout: the absmax reduces over lane bits
// 1, 2, 4 (lanes sharing a row and a group), and PV is amdgpu.mfma. At 4 rows
// no padding row shares a lane with a live one: each second term is its own MFMA.
// GFX942-LABEL: func.func @decode_partition
// GFX942-COUNT-32: amdgpu.mfma 16x16x32
// GFX942: math.absf
// GFX942: gpu.shuffle xor %{{.*}}, %c1_i32, %c64_i32 : f32
// GFX942-NEXT: arith.maximumf
// GFX942-NEXT: gpu.shuffle xor %{{.*}}, %c2_i32, %c64_i32 : f32
// GFX942-NEXT: arith.maximumf
// GFX942-NEXT: gpu.shuffle xor %{{.*}}, %c4_i32, %c64_i32 : f32
// GFX942-NEXT: arith.maximumf
// GFX942-NOT: %c8_i32, %c64_i32
// GFX942-COUNT-32: amdgpu.mfma 16x16x32
// GFX942-NOT: amdgpu.mfma
// GFX942-LABEL: stream.executable private @decode_merge
func.func @decode(%q: tensor<1x32x128xf32>, %k: tensor<1x8x4096x128xi8>, %ks: tensor<1x8x4096xf32>, %v: tensor<1x8x4096x128xi8>, %vs: tensor<1x8x4096xf32>) -> tensor<1x32x128xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.0883883461 : f32} : (tensor<1x32x128xf32>, tensor<1x8x4096x128xi8>, tensor<1x8x4096xf32>, tensor<1x8x4096x128xi8>, tensor<1x8x4096xf32>) -> tensor<1x32x128xf32>
  return %o : tensor<1x32x128xf32>
}
