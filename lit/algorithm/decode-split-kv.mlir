// RUN: int8attn-opt %s -p decode-split-kv | filecheck %s
// RUN: int8attn-opt %s -p "decode-split-kv{partition-tokens=64}" | filecheck %s --check-prefix=T64

// 300 tokens -> 2 partitions of 256; the tail scores are -inf, V and its
// scales are padded with zeros; per-partition max/sum/normalize, then the
// log-sum-exp merge of the partition outputs.
// CHECK-LABEL: func.func @split
// CHECK-SAME: (%[[S:.*]]: tensor<1x2x4x300xf32>, %[[V:.*]]: tensor<1x2x300x16xi8>, %[[VS:.*]]: tensor<1x2x300xf32>)
// CHECK-DAG: %[[NEG_INF:.*]] = arith.constant 0xFF800000 : f32
// CHECK-DAG: %[[ZERO_I8:.*]] = arith.constant 0 : i8
// CHECK: %[[SFILL:.*]] = linalg.fill ins(%[[NEG_INF]] : f32) {{.*}} -> tensor<1x2x4x512xf32>
// CHECK: %[[SPAD:.*]] = tensor.insert_slice %[[S]] into %[[SFILL]][0, 0, 0, 0] [1, 2, 4, 300]
// CHECK: %[[SB:.*]] = tensor.expand_shape %[[SPAD]] {{.*}} output_shape [1, 2, 4, 2, 256]
// CHECK: %[[VFILL:.*]] = linalg.fill ins(%[[ZERO_I8]] : i8) {{.*}} -> tensor<1x2x512x16xi8>
// CHECK: %[[VPAD:.*]] = tensor.insert_slice %[[V]] into %[[VFILL]]
// CHECK: %[[VB:.*]] = tensor.expand_shape %[[VPAD]] {{.*}} output_shape [1, 2, 2, 256, 16]
// CHECK: %[[VSB:.*]] = tensor.expand_shape %{{.*}} output_shape [1, 2, 2, 256]
// CHECK: %[[M:.*]] = linalg.generic {{.*}} ins(%[[SB]] : tensor<1x2x4x2x256xf32>)
// CHECK:   arith.maximumf
// CHECK: } -> tensor<1x2x4x2xf32>
// CHECK: %[[E:.*]] = linalg.generic {{.*}} ins(%[[SB]], %[[M]] :
// CHECK:   arith.subf
// CHECK:   math.roundeven
// CHECK:   math.exp
// CHECK: %[[L:.*]] = linalg.generic {{.*}} ins(%[[E]] : tensor<1x2x4x2x256xf32>)
// CHECK:   arith.addf
// CHECK: %[[P:.*]] = linalg.generic {{.*}} ins(%[[E]], %[[L]] :
// CHECK:   arith.divf
// Each partition's sums accumulate from zeros.
// CHECK: %[[O0:.*]] = linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : tensor<1x2x4x2x16xf32>)
// CHECK: %[[OP:.*]] = "int8attn.pv"(%[[P]], %[[VB]], %[[VSB]], %[[O0]]) : (tensor<1x2x4x2x256xf32>, tensor<1x2x2x256x16xi8>, tensor<1x2x2x256xf32>, tensor<1x2x4x2x16xf32>) -> tensor<1x2x4x2x16xf32>
// CHECK: %[[MALL:.*]] = linalg.generic {{.*}} ins(%[[M]] : tensor<1x2x4x2xf32>)
// CHECK: %[[W:.*]] = linalg.generic {{.*}} ins(%[[M]], %[[MALL]], %[[L]] :
// CHECK:   arith.subf
// CHECK:   math.roundeven
// CHECK:   math.exp
// CHECK:   arith.mulf
// CHECK: %[[NUM:.*]] = linalg.generic {{.*}} ins(%[[W]], %[[OP]] :
// CHECK: %[[DEN:.*]] = linalg.generic {{.*}} ins(%[[W]] :
// CHECK: %[[OUT:.*]] = linalg.generic {{.*}} ins(%[[NUM]], %[[DEN]] :
// CHECK:   arith.divf
// CHECK: return %[[OUT]] : tensor<1x2x4x16xf32>

// T64-LABEL: func.func @split
// T64: tensor.expand_shape {{.*}} output_shape [1, 2, 4, 5, 64]
// T64: "int8attn.pv"({{.*}}) : (tensor<1x2x4x5x64xf32>, tensor<1x2x5x64x16xi8>, tensor<1x2x5x64xf32>, tensor<1x2x4x5x16xf32>) -> tensor<1x2x4x5x16xf32>
func.func @split(%s: tensor<1x2x4x300xf32>, %v: tensor<1x2x300x16xi8>, %vs: tensor<1x2x300xf32>) -> tensor<1x2x4x16xf32> {
  %o = "int8attn.softmax_pv"(%s, %v, %vs) {mode = "decode"} : (tensor<1x2x4x300xf32>, tensor<1x2x300x16xi8>, tensor<1x2x300xf32>) -> tensor<1x2x4x16xf32>
  return %o : tensor<1x2x4x16xf32>
}

// A context of exactly one partition needs no padding.
// CHECK-LABEL: func.func @exact_partition
// CHECK-NOT: tensor.insert_slice
// CHECK: "int8attn.pv"
func.func @exact_partition(%s: tensor<1x1x1x256xf32>, %v: tensor<1x1x256x16xi8>, %vs: tensor<1x1x256xf32>) -> tensor<1x1x1x16xf32> {
  %o = "int8attn.softmax_pv"(%s, %v, %vs) {mode = "decode"} : (tensor<1x1x1x256xf32>, tensor<1x1x256x16xi8>, tensor<1x1x256xf32>) -> tensor<1x1x1x16xf32>
  return %o : tensor<1x1x1x16xf32>
}
