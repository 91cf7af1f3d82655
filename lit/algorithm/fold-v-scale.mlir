// RUN: int8attn-opt %s -p fold-v-scale | filecheck %s

// W = P * sV, broadcast over the query rows of each KV head.
// CHECK-DAG: #[[ROWS:.*]] = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3, d4)>
// CHECK-DAG: #[[KV:.*]] = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3, d4)>
// CHECK-LABEL: func.func @fold
// CHECK-SAME: (%[[P:.*]]: tensor<1x2x4x2x256xf32>, %[[V:.*]]: tensor<1x2x2x256x16xi8>, %[[VS:.*]]: tensor<1x2x2x256xf32>, %[[ACC:.*]]: tensor<1x2x4x2x16xf32>)
// CHECK: %[[W:.*]] = linalg.generic {indexing_maps = [#[[ROWS]], #[[KV]], #[[ROWS]]], {{.*}} ins(%[[P]], %[[VS]] :
// CHECK:   %[[PROD:.*]] = arith.mulf
// CHECK:   linalg.yield %[[PROD]]
// The sums still accumulate into the same O.
// CHECK: %[[O:.*]] = "int8attn.folded_pv"(%[[W]], %[[V]], %[[ACC]]) : (tensor<1x2x4x2x256xf32>, tensor<1x2x2x256x16xi8>, tensor<1x2x4x2x16xf32>) -> tensor<1x2x4x2x16xf32>
// CHECK: return %[[O]]
func.func @fold(%p: tensor<1x2x4x2x256xf32>, %v: tensor<1x2x2x256x16xi8>, %vs: tensor<1x2x2x256xf32>, %acc: tensor<1x2x4x2x16xf32>) -> tensor<1x2x4x2x16xf32> {
  %o = "int8attn.pv"(%p, %v, %vs, %acc) : (tensor<1x2x4x2x256xf32>, tensor<1x2x2x256x16xi8>, tensor<1x2x2x256xf32>, tensor<1x2x4x2x16xf32>) -> tensor<1x2x4x2x16xf32>
  return %o : tensor<1x2x4x2x16xf32>
}
