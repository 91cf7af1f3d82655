// RUN: int8attn compile %s --target cuda --emit kernel -o - | filecheck %s
// RUN: int8attn compile %s --target cuda --q-second scaled --w-second scaled --emit kernel -o - | filecheck %s --check-prefix=SCALED

// Decode on mma.sync.m16n8k32.s8, 32 query heads over 8 KV heads (4 rows per tile),
// D = 128, with the kernels' default numerics: two-term q and W, each second term the
// low INT8 digit of one 256x finer quantization (docs/design.md §2c). C holds rows g and
// g + 8 of a column in one lane, so the low digits sit in padding rows 8..11 of the same
// A tile: QK is 8 token blocks x 4 K steps and PV 2 MMACs x 16 head-dim tiles, as for
// one term, and each pair of sums is joined (high << 8) + low before one conversion.
// CHECK-LABEL: func.func @decode_partition
// The MMAs' starting accumulator: the round bias's bits (below); the scores' constant
// c = softmax_scale * log2 e (0.0883883 * log2 e), and no log2 e of its own.
// CHECK-NOT: arith.constant 1.44269502
// CHECK-DAG: %[[INIT:.*]] = arith.constant dense<1262485504> : vector<2x2xi32>
// CHECK-DAG: %[[SCORE_C:.*]] = arith.constant 0.127517432 : f32
// The query rows: t = roundeven(clamp(q * inv) * 256), read off the bits of
// clamp(q * inv) + 1.5*2^15, whose sums step by 1/256 (contract.to_int(fine=True)); the
// bias's bits (0x47400000) end in two zero bytes, so no subtract: high = (bits + 128)
// >> 8 and low = t - (high << 8) keep t's and (t + 128) >> 8's low bytes, the i8s.
// CHECK: %[[BIASED:.*]] = arith.addf %{{.*}}, %{{cst_[0-9]+}} : f32
// CHECK-NEXT: %[[BITS:.*]] = arith.bitcast %[[BIASED]] : f32 to i32
// CHECK-NEXT: %[[UP:.*]] = arith.addi %[[BITS]], %c128_i32 : i32
// CHECK-NEXT: %[[HIGH:.*]] = arith.shrsi %[[UP]], %c8_i32 : i32
// CHECK-NEXT: arith.trunci %[[HIGH]] : i32 to i8
// CHECK-NEXT: arith.trunci %[[BITS]] : i32 to i8
// A row's score scale goes into LDS as sQ * c: the scores come out in log2 units.
// CHECK: %[[SQC:.*]] = arith.mulf %{{.*}}, %[[SCORE_C]] : f32
// CHECK-NEXT: memref.store %[[SQC]], %{{.*}} : memref<16xf32, #gpu.address_space<workgroup>>
// Qq sits in LDS in the MMA's register order (fragments/operand_staging.py): each K
// step's A operand is one aligned 16-byte load, its registers a0..a3 in order.
// CHECK-COUNT-4: vector.load %{{.*}} alignment = 16 : memref<16x128xi8, #gpu.address_space<workgroup>>, vector<16xi8>
// A score: the high digit's sum (C row g) and the low digit's (row g + 8) of one MMA
// (the 32 QK MMAs are issued before the first score is read). The MMAs start from
// the bias's bits, so each sum's bits are the f32 1.5*2^23 + sum (contract.exact_f32):
// less the bias, then joined high * 256 + low in one fma.
// CHECK-COUNT-31: nvgpu.mma.sync
// CHECK: %[[QK:.*]] = nvgpu.mma.sync(%{{.*}}, %{{.*}}, %{{.*}}) {{.*}} -> vector<2x2xi32>
// CHECK-NEXT: %[[QH:.*]] = vector.extract %[[QK]][0, 0] : i32 from vector<2x2xi32>
// CHECK-NEXT: %[[QL:.*]] = vector.extract %[[QK]][1, 0] : i32 from vector<2x2xi32>
// CHECK-NEXT: %[[QHF:.*]] = arith.bitcast %[[QH]] : i32 to f32
// CHECK-NEXT: %[[QHX:.*]] = arith.subf %[[QHF]], %[[BIAS:cst_[0-9]+]] : f32
// CHECK-NEXT: %[[QLF:.*]] = arith.bitcast %[[QL]] : i32 to f32
// CHECK-NEXT: %[[QLX:.*]] = arith.subf %[[QLF]], %[[BIAS]] : f32
// CHECK-NEXT: math.fma %[[QHX]], %{{.*}}, %[[QLX]] : f32
// The partition softmax: e = 2^(s - m) on the hardware's exp2 (TargetSpec.exp2), the
// scores already in log2 units (c is in each row's sQ): no multiply by log2 e (none
// in the kernel, above), and no polynomial math.exp.
// CHECK-NOT: math.exp
// CHECK: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f32"(%{{.*}}) : (f32) -> f32
// CHECK-NOT: math.exp
// PV the same way, scaled by sW1 / 256 per (row, MMAC); Wq read in register order too.
// CHECK-COUNT-2: vector.load %{{.*}} alignment = 16 : memref<4x16x64xi8, #gpu.address_space<workgroup>>, vector<16xi8>
// CHECK: %[[PV:.*]] = nvgpu.mma.sync(%{{.*}}, %{{.*}}, %[[INIT]])
// CHECK: %[[WH:.*]] = vector.extract %[[PV]][0, 0] : i32 from vector<2x2xi32>
// CHECK: %[[WL:.*]] = vector.extract %[[PV]][1, 0] : i32 from vector<2x2xi32>
// CHECK: arith.bitcast %[[WH]] : i32 to f32
// CHECK: arith.bitcast %[[WL]] : i32 to f32
// CHECK: math.fma
// CHECK-LABEL: stream.executable private @decode_merge
// The merge loads its first partitions' partials before the rows' max M (shuffles,
// then LDS behind a barrier): their L2 round trip overlaps the max's.
// CHECK: vector.load %{{.*}} : memref<1x8x16x4x128xf32>, vector<4xf32>
// CHECK: gpu.shuffle xor
// CHECK: gpu.barrier

// The scaled second terms (the cpu pipeline's): the same MMA count (packed too), but
// a residual, its own absmax and two conversions per score, no digit split.
// SCALED-LABEL: func.func @decode_partition
// SCALED-NOT: arith.shrsi
// SCALED: math.fma
// SCALED-COUNT-64: nvgpu.mma.sync
// SCALED-NOT: nvgpu.mma.sync
// SCALED-LABEL: stream.executable private @decode_merge
func.func @decode(%q: tensor<1x32x128xf32>, %k: tensor<1x8x4096x128xi8>, %ks: tensor<1x8x4096xf32>, %v: tensor<1x8x4096x128xi8>, %vs: tensor<1x8x4096xf32>) -> tensor<1x32x128xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.0883883461 : f32} : (tensor<1x32x128xf32>, tensor<1x8x4096x128xi8>, tensor<1x8x4096xf32>, tensor<1x8x4096x128xi8>, tensor<1x8x4096xf32>) -> tensor<1x32x128xf32>
  return %o : tensor<1x32x128xf32>
}
