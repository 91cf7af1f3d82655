// RUN: int8attn-opt %s -p prefill-online-softmax | filecheck %s

// 8 rows = 4 heads x 2 query tokens at positions 128 and 129 of 130 tokens.
// The causal mask, then a loop over 3 KV tiles of 64 carrying (m, l, o), the
// guarded rescale alpha = 2^(m - m'), unnormalized p = 2^(s - m') (scores in log2
// units; `contract.exp2`: 2^roundeven(x) from its bits times exp((x - n) ln 2)), the
// shared int8attn.pv for the tile, and O = o / l after the loop.
// CHECK-LABEL: func.func @prefill
// CHECK-SAME: (%[[S:.*]]: tensor<1x2x8x130xf32>, %[[V:.*]]: tensor<1x2x130x16xi8>, %[[VS:.*]]: tensor<1x2x130xf32>)
// CHECK-DAG: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-DAG: %[[TILES:.*]] = arith.constant 3 : index
// CHECK-DAG: %[[HISTORY:.*]] = arith.constant 128 : index
// CHECK-DAG: %[[SQ:.*]] = arith.constant 2 : index
// CHECK-DAG: %[[NEG_INF:.*]] = arith.constant 0xFF800000 : f32
// CHECK-DAG: %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK: %[[MASKED:.*]] = linalg.generic
// CHECK:   %[[ROW:.*]] = linalg.index 2 : index
// CHECK:   %[[TOKEN:.*]] = linalg.index 3 : index
// CHECK:   %[[QUERY:.*]] = arith.remui %[[ROW]], %[[SQ]] : index
// CHECK:   %[[POS:.*]] = arith.addi %[[QUERY]], %[[HISTORY]] : index
// CHECK:   %[[VISIBLE:.*]] = arith.cmpi ule, %[[TOKEN]], %[[POS]] : index
// CHECK:   arith.select %[[VISIBLE]], %{{.*}}, %[[NEG_INF]] : f32
// CHECK: %[[ST:.*]] = tensor.expand_shape %[[MASKED]] {{.*}} output_shape [1, 2, 8, 3, 64]
// CHECK: %[[VT:.*]] = tensor.expand_shape {{.*}} output_shape [1, 2, 3, 64, 16]
// CHECK: %[[VST:.*]] = tensor.expand_shape {{.*}} output_shape [1, 2, 3, 64]
// CHECK: %[[M0:.*]] = linalg.fill ins(%[[NEG_INF]] : f32) {{.*}} -> tensor<1x2x8xf32>
// CHECK: %[[L0:.*]] = linalg.fill ins(%[[ZERO]] : f32) {{.*}} -> tensor<1x2x8xf32>
// CHECK: %[[O0:.*]] = linalg.fill ins(%[[ZERO]] : f32) {{.*}} -> tensor<1x2x8x16xf32>
// CHECK: %[[LOOP:.*]]:3 = scf.for %[[N:.*]] = %{{.*}} to %[[TILES]] step %{{.*}} iter_args(%[[M:.*]] = %[[M0]], %[[L:.*]] = %[[L0]], %[[O:.*]] = %[[O0]]) -> (tensor<1x2x8xf32>, tensor<1x2x8xf32>, tensor<1x2x8x16xf32>)
// CHECK:   %[[STILE:.*]] = tensor.extract_slice %[[ST]][0, 0, 0, %[[N]], 0] [1, 2, 8, 1, 64]
// CHECK:   %[[VTILE:.*]] = tensor.extract_slice %[[VT]][0, 0, %[[N]], 0, 0] [1, 2, 1, 64, 16]
// CHECK:   %[[VSTILE:.*]] = tensor.extract_slice %[[VST]][0, 0, %[[N]], 0] [1, 2, 1, 64]
// CHECK:   %[[MTILE:.*]] = linalg.generic {{.*}} ins(%[[STILE]] :
// CHECK:     arith.maximumf
// CHECK:   %[[MNEW:.*]] = linalg.generic {{.*}} ins(%[[M]], %[[MTILE]] :
// CHECK:   %[[ALPHA:.*]] = linalg.generic {{.*}} ins(%[[M]], %[[MNEW]] :
// CHECK:     %[[DEAD:.*]] = arith.cmpf oeq, %{{.*}}, %[[NEG_INF]] : f32
// CHECK:     %[[DA:.*]] = arith.subf
// CHECK:     %[[NA:.*]] = math.roundeven %[[DA]] : f32
// CHECK:     %[[FA:.*]] = math.exp
// CHECK:     %[[E:.*]] = arith.mulf %[[FA]], %{{.*}} : f32
// CHECK:     arith.select %[[DEAD]], %[[ONE]], %[[E]] : f32
// CHECK:   %[[P:.*]] = linalg.generic {{.*}} ins(%[[STILE]], %[[MNEW]] :
// CHECK:     %[[DEADP:.*]] = arith.cmpf oeq, %{{.*}}, %[[NEG_INF]] : f32
// CHECK:     math.roundeven
// CHECK:     %[[FP:.*]] = math.exp
// CHECK:     %[[EP:.*]] = arith.mulf %[[FP]], %{{.*}} : f32
// CHECK:     arith.select %[[DEADP]], %[[ZERO]], %[[EP]] : f32
// CHECK:   %[[LSCALED:.*]] = linalg.generic {{.*}} ins(%[[L]], %[[ALPHA]] :
// CHECK:   %[[LNEW:.*]] = linalg.generic {{.*}} ins(%[[P]] : {{.*}} outs(%[[LSCALED]] :
// The tile's PV accumulates into alpha o (the contract's chain goes on from it).
// CHECK:   %[[OSCALED:.*]] = linalg.generic {{.*}} ins(%[[O]], %[[ALPHA]] :
// CHECK:   %[[START:.*]] = tensor.expand_shape %[[OSCALED]] {{\[}}[0], [1], [2], [3, 4]] output_shape [1, 2, 8, 1, 16]
// CHECK:   %[[PV:.*]] = "int8attn.pv"(%[[P]], %[[VTILE]], %[[VSTILE]], %[[START]]) : (tensor<1x2x8x1x64xf32>, tensor<1x2x1x64x16xi8>, tensor<1x2x1x64xf32>, tensor<1x2x8x1x16xf32>) -> tensor<1x2x8x1x16xf32>
// CHECK:   %[[ONEW:.*]] = tensor.collapse_shape %[[PV]] {{\[}}[0], [1], [2], [3, 4]]
// CHECK:   scf.yield %[[MNEW]], %[[LNEW]], %[[ONEW]]
// CHECK: %[[OUT:.*]] = linalg.generic {{.*}} ins(%[[LOOP]]#2, %[[LOOP]]#1 :
// CHECK:   arith.divf
// CHECK: return %[[OUT]]
func.func @prefill(%s: tensor<1x2x8x130xf32>, %v: tensor<1x2x130x16xi8>, %vs: tensor<1x2x130xf32>) -> tensor<1x2x8x16xf32> {
  %o = "int8attn.softmax_pv"(%s, %v, %vs) {mode = "prefill", query_tokens = 2 : i64} : (tensor<1x2x8x130xf32>, tensor<1x2x130x16xi8>, tensor<1x2x130xf32>) -> tensor<1x2x8x16xf32>
  return %o : tensor<1x2x8x16xf32>
}

// Decode ops are left for decode-split-kv.
// CHECK-LABEL: func.func @decode
// CHECK: "int8attn.softmax_pv"{{.*}}mode = "decode"
func.func @decode(%s: tensor<1x1x4x64xf32>, %v: tensor<1x1x64x16xi8>, %vs: tensor<1x1x64xf32>) -> tensor<1x1x4x16xf32> {
  %o = "int8attn.softmax_pv"(%s, %v, %vs) {mode = "decode"} : (tensor<1x1x4x64xf32>, tensor<1x1x64x16xi8>, tensor<1x1x64xf32>) -> tensor<1x1x4x16xf32>
  return %o : tensor<1x1x4x16xf32>
}
