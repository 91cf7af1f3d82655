// RUN: int8attn-opt %s --split-input-file -p "lower-paged-attention{q-terms=1}" | filecheck %s --check-prefixes=CHECK,PREFILL
// RUN: int8attn-opt %s --split-input-file -p "lower-paged-attention{partition-tokens=64 q-terms=1}" | filecheck %s --check-prefix=T64
// RUN: int8attn-opt %s --split-input-file --pipeline int8attn-to-algorithm | filecheck %s --check-prefix=ALGO

// A loop over the (dynamic) batch; per sequence the query rows are quantized
// once, then a loop over its own partitions gathers each partition's tokens
// through the block table (a token past the length reads the last used slot,
// its scales are 0 and its score -inf), runs the dense partition softmax and
// int8attn.pv, and merges into the running (M, L, O).
// CHECK-LABEL: func.func @paged
// CHECK-SAME: (%[[Q:[^:]*]]: tensor<?x8x64xf32>, %[[KC:[^:]*]]: tensor<?x2x16x64xi8>, %{{[^:]*}}: tensor<?x2x16xf32>, %[[VC:[^:]*]]: tensor<?x2x64x16xi8>, %{{[^:]*}}: tensor<?x2x16xf32>, %[[BT:[^:]*]]: tensor<?x?xi32>, %[[CL:[^:]*]]: tensor<?xi32>)
// CHECK-DAG: %[[C0:.*]] = arith.constant 0 : index
// CHECK-DAG: %[[C1:.*]] = arith.constant 1 : index
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : index
// CHECK-DAG: %[[C256:.*]] = arith.constant 256 : index
// CHECK: %[[B:.*]] = tensor.dim %[[Q]], %[[C0]] : tensor<?x8x64xf32>
// CHECK: %[[INIT:.*]] = tensor.empty(%[[B]]) : tensor<?x8x64xf32>
// CHECK: %[[OUT:.*]] = scf.for %[[SEQ:.*]] = %[[C0]] to %[[B]] step %[[C1]] iter_args(%[[ACC:.*]] = %[[INIT]])
// CHECK:   %[[QB:.*]] = tensor.extract_slice %[[Q]][%[[SEQ]], 0, 0] [1, 8, 64]
// CHECK:   "int8attn.quantize"(%{{.*}}) : (tensor<1x2x4x64xf32>) -> (tensor<1x2x4x64xi8>, tensor<1x2x4xf32>)
// CHECK:   %[[LEN32:.*]] = tensor.extract %[[CL]][%[[SEQ]]] : tensor<?xi32>
// CHECK:   %[[LEN:.*]] = arith.index_cast %[[LEN32]] : i32 to index
// CHECK:   %[[PARTS:.*]] = arith.divui %{{.*}}, %[[C256]] : index
// CHECK:   scf.for %[[P:.*]] = %[[C0]] to %[[PARTS]] step %[[C1]] iter_args(
// CHECK:     %[[START:.*]] = arith.muli %[[P]], %[[C256]] : index
// CHECK:     linalg.generic {{.*}} outs(%{{.*}} : tensor<1x2x256x64xi8>)
// CHECK:       %[[TOKEN:.*]] = arith.addi %[[START]], %{{.*}} : index
// CHECK:       %[[SLOT:.*]] = arith.divui %[[TOKEN]], %[[C16]] : index
// CHECK:       %[[USED:.*]] = arith.minui %[[SLOT]], %{{.*}} : index
// CHECK:       tensor.extract %[[BT]][%[[SEQ]], %[[USED]]] : tensor<?x?xi32>
// CHECK:       %[[OFF:.*]] = arith.remui %[[TOKEN]], %[[C16]] : index
// CHECK:       tensor.extract %[[KC]][%{{.*}}, %{{.*}}, %[[OFF]], %{{.*}}] : tensor<?x2x16x64xi8>
// CHECK:     arith.cmpi ult
// CHECK:     arith.select %{{.*}}, %{{.*}}, %cst{{.*}} : f32
// CHECK:     tensor.extract %[[VC]][%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}] : tensor<?x2x64x16xi8>
// CHECK:     %[[PV0:.*]] = linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : tensor<1x2x4x1x64xf32>)
// CHECK:     %[[PV:.*]] = "int8attn.pv"(%{{.*}}, %{{.*}}, %{{.*}}, %[[PV0]]) : (tensor<1x2x4x1x256xf32>, tensor<1x2x1x256x64xi8>, tensor<1x2x1x256xf32>, tensor<1x2x4x1x64xf32>) -> tensor<1x2x4x1x64xf32>
// CHECK:     arith.maximumf
// CHECK:     math.roundeven
// CHECK:     math.exp
// CHECK:     scf.yield
// CHECK:   arith.divf
// CHECK:   %[[NEXT:.*]] = tensor.insert_slice %{{.*}} into %[[ACC]][%[[SEQ]], 0, 0] [1, 8, 64] [1, 1, 1]
// CHECK:   scf.yield %[[NEXT]] : tensor<?x8x64xf32>
// CHECK: return %[[OUT]] : tensor<?x8x64xf32>

// T64-LABEL: func.func @paged
// T64: "int8attn.pv"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<1x2x4x1x64xf32>, tensor<1x2x1x64x64xi8>, tensor<1x2x1x64xf32>, tensor<1x2x4x1x64xf32>) -> tensor<1x2x4x1x64xf32>

// The same W groups as the dense decode: the fragment model's 256-token partition table, verified.
// ALGO-LABEL: func.func @paged
// ALGO: "int8attn.group_quantize"(%{{.*}}) {groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
// ALGO: "int8attn.mmac_tiles"
// ALGO-NOT: int8attn.paged_attention
func.func @paged(%q: tensor<?x8x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> tensor<?x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.125 : f32} : (tensor<?x8x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %o : tensor<?x8x64xf32>
}

// -----

// Chunked prefill (q [B, Hq, Sq, D]): per sequence the Sq*G query rows (head-major)
// are quantized once, then a loop over its own 64-token tiles gathers them through
// the block table, masks causally with the sequence's history len - Sq
// (contract.causal_visible: key <= history + row % Sq) and runs the dense
// prefill's online-softmax step (int8attn.pv on the tile) carrying (m, l, o).
// PREFILL-LABEL: func.func @chunk
// PREFILL: scf.for %[[SEQ:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[ACC:.*]] = %{{.*}}) -> (tensor<?x8x37x64xf32>)
// PREFILL:   "int8attn.quantize"(%{{.*}}) : (tensor<1x2x148x64xf32>) -> (tensor<1x2x148x64xi8>, tensor<1x2x148xf32>)
// PREFILL:   %[[LEN:.*]] = arith.index_cast %{{.*}} : i32 to index
// PREFILL:   %[[HISTORY:.*]] = arith.subi %[[LEN]], %c37 : index
// PREFILL:   %[[TILES:.*]] = arith.divui %{{.*}}, %c64 : index
// PREFILL:   scf.for %[[T:.*]] = %{{.*}} to %[[TILES]] step %{{.*}} iter_args(%{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}) -> (tensor<1x2x148xf32>, tensor<1x2x148xf32>, tensor<1x2x148x64xf32>)
// PREFILL:     %[[START:.*]] = arith.muli %[[T]], %c64 : index
// PREFILL:     linalg.generic {{.*}} outs(%{{.*}} : tensor<1x2x64x64xi8>)
// PREFILL:       tensor.extract %{{.*}}[%[[SEQ]], %{{.*}}] : tensor<?x?xi32>
// PREFILL:     linalg.generic {{.*}} ins(%{{.*}} : tensor<1x2x148x64xf32>) outs(%{{.*}} : tensor<1x2x148x64xf32>)
// PREFILL:       %[[KEY:.*]] = arith.addi %[[START]], %{{.*}} : index
// PREFILL:       %[[QTOKEN:.*]] = arith.remui %{{.*}}, %c37 : index
// PREFILL:       %[[LAST:.*]] = arith.addi %[[QTOKEN]], %[[HISTORY]] : index
// PREFILL:       arith.cmpi ule, %[[KEY]], %[[LAST]] : index
// The chunk's tile sums go on from alpha o.
// PREFILL:     "int8attn.pv"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<1x2x148x1x64xf32>, tensor<1x2x1x64x64xi8>, tensor<1x2x1x64xf32>, tensor<1x2x148x1x64xf32>) -> tensor<1x2x148x1x64xf32>
// PREFILL:     scf.yield
// PREFILL:   arith.divf
// PREFILL:   tensor.insert_slice %{{.*}} into %[[ACC]][%[[SEQ]], 0, 0, 0] [1, 8, 37, 64] [1, 1, 1, 1]
func.func @chunk(%q: tensor<?x8x37x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> tensor<?x8x37x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.125 : f32} : (tensor<?x8x37x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x37x64xf32>
  return %o : tensor<?x8x37x64xf32>
}

// -----

// A static batch stays static: the loop runs to the constant B and the result
// keeps the op's type (tensor<3x...>), so the function's return type matches.
// CHECK-LABEL: func.func @static
// CHECK-DAG: %[[C3:.*]] = arith.constant 3 : index
// CHECK: %[[INIT:.*]] = tensor.empty() : tensor<3x4x32xf32>
// CHECK: %[[OUT:.*]] = scf.for %{{.*}} = %{{.*}} to %[[C3]] step %{{.*}} iter_args(%{{.*}} = %[[INIT]]) -> (tensor<3x4x32xf32>)
// CHECK: return %[[OUT]] : tensor<3x4x32xf32>
func.func @static(%q: tensor<3x4x32xf32>, %kc: tensor<12x2x16x32xi8>, %ks: tensor<12x2x16xf32>, %vc: tensor<12x2x32x16xi8>, %vs: tensor<12x2x16xf32>, %bt: tensor<3x4xi32>, %cl: tensor<3xi32>) -> tensor<3x4x32xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.176776695 : f32} : (tensor<3x4x32xf32>, tensor<12x2x16x32xi8>, tensor<12x2x16xf32>, tensor<12x2x32x16xi8>, tensor<12x2x16xf32>, tensor<3x4xi32>, tensor<3xi32>) -> tensor<3x4x32xf32>
  return %o : tensor<3x4x32xf32>
}
