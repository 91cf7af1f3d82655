// Each chunk is rewritten or refused on its own: with the default (one MMAC per
// accumulator) the last, chained chunk is refused; with w-chain=2 the one-MMAC groups are.
// RUN: not int8attn-opt %s --split-input-file -p pv-to-mmac 2>/dev/null | filecheck %s
// RUN: not int8attn-opt %s --split-input-file -p pv-to-mmac 2>&1 | filecheck %s --check-prefix=ONE
// RUN: not int8attn-opt %s --split-input-file -p "pv-to-mmac{w-chain=2}" 2>/dev/null | filecheck %s --check-prefix=CHAIN
// RUN: not int8attn-opt %s --split-input-file -p "pv-to-mmac{w-chain=2}" 2>&1 | filecheck %s --check-prefix=REFUSED
// ONE: pv-to-mmac.mlir:[[# @LINE + 52]]:8: error: 'int8attn.grouped_pv' op has groups of 64 tokens but gfx936's v_mmac_i32_16x16x32_i8 consumes K=32
// REFUSED: pv-to-mmac.mlir:[[# @LINE + 18]]:8: error: 'int8attn.grouped_pv' op has groups of 32 tokens but gfx936's v_mmac_i32_16x16x32_i8 consumes K=32 x 2 chained (w-chain)
// REFUSED: pv-to-mmac.mlir:[[# @LINE + 32]]:8: error: 'int8attn.grouped_pv' op has groups of 32 tokens but gfx936's v_mmac_i32_16x16x32_i8 consumes K=32 x 2 chained (w-chain)
// The int32 contraction stays inside one K=32 group (one MMAC); the groups
// go into the op's acc in f32, each rescaled by its sW in one FMA (rounded once).
// CHECK-LABEL: func.func @tiles
// CHECK-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x32xi8>, %[[SW:.*]]: tensor<1x1x4x1x2xf32>, %[[V:.*]]: tensor<1x1x1x64x16xi8>, %[[O0:.*]]: tensor<1x1x4x1x16xf32>)
// CHECK: %[[ACC:.*]] = "int8attn.mmac_tiles"(%[[WQ]], %[[V]])
// CHECK-SAME: fragment_model = "gfx936"
// CHECK-SAME: -> tensor<1x1x4x1x2x16xi32>
// CHECK: %[[O:.*]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%[[ACC]], %[[SW]] : {{.*}}) outs(%[[O0]] :
// CHECK:   ^bb0(%{{.*}}: i32, %[[SG:.*]]: f32, %[[TOTAL:.*]]: f32):
// CHECK:   %[[F:.*]] = arith.sitofp %{{.*}} : i32 to f32
// CHECK:   %[[O2:.*]] = math.fma %[[F]], %[[SG]], %[[TOTAL]] : f32
// CHECK:   linalg.yield %[[O2]]
// CHECK: return %[[O]]
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @tiles(%wq: tensor<1x1x4x1x2x32xi8>, %sw: tensor<1x1x4x1x2xf32>, %v: tensor<1x1x1x64x16xi8>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %o = "int8attn.grouped_pv"(%wq, %sw, %v, %acc) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// Unsigned W: the column sums go to the tiles (their accumulator starts at
// 128 * sum Vq); the rescale is the same.
// CHECK-LABEL: func.func @unsigned_tiles
// CHECK-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x32xi8>, %[[SW:.*]]: tensor<1x1x4x1x2xf32>, %[[V:.*]]: tensor<1x1x1x64x16xi8>, %[[CS:.*]]: tensor<1x1x1x2x16xi32>, %[[O0:.*]]: tensor<1x1x4x1x16xf32>)
// CHECK: %[[ACC:.*]] = "int8attn.mmac_tiles"(%[[WQ]], %[[V]], %[[CS]])
// CHECK: linalg.generic {{.*}} ins(%[[ACC]], %[[SW]] : {{.*}}) outs(%[[O0]] :
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @unsigned_tiles(%wq: tensor<1x1x4x1x2x32xi8>, %sw: tensor<1x1x4x1x2xf32>, %v: tensor<1x1x1x64x16xi8>, %cs: tensor<1x1x1x2x16xi32>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %o = "int8attn.grouped_pv"(%wq, %sw, %v, %acc, %cs) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>, tensor<1x1x1x2x16xi32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// w-chain=2: each group is the 64 tokens of two chained MMACs (one wave of
// gfx936); one int32 accumulator per chain (its tiles' sums added in int32, the
// column sums with them), one conversion and one FMA each.
// CHAIN-LABEL: func.func @chained_tiles
// CHAIN-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x1x64xi8>, %[[SW:.*]]: tensor<1x1x4x1x1xf32>, %[[V:.*]]: tensor<1x1x1x64x16xi8>, %[[CS:.*]]: tensor<1x1x1x1x16xi32>, %[[O0:.*]]: tensor<1x1x4x1x16xf32>)
// CHAIN: %[[ACC:.*]] = "int8attn.mmac_tiles"(%[[WQ]], %[[V]], %[[CS]]) {chain = 2 : i64, fragment_model = "gfx936", groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55, 8, 9, 10,
// CHAIN-SAME: -> tensor<1x1x4x1x1x16xi32>
// CHAIN: linalg.generic {{.*}} ins(%[[ACC]], %[[SW]] : {{.*}}) outs(%[[O0]] :
// CHAIN:   arith.sitofp %{{.*}} : i32 to f32
// CHAIN:   math.fma
#chain = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @chained_tiles(%wq: tensor<1x1x4x1x1x64xi8>, %sw: tensor<1x1x4x1x1xf32>, %v: tensor<1x1x1x64x16xi8>, %cs: tensor<1x1x1x1x16xi32>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %o = "int8attn.grouped_pv"(%wq, %sw, %v, %acc, %cs) {groups = #chain} : (tensor<1x1x4x1x1x64xi8>, tensor<1x1x4x1x1xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>, tensor<1x1x1x1x16xi32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}
