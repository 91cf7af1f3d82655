// RUN: int8attn-opt %s -p lower-mmac-tiles | filecheck %s

// V is gathered into fragment order through the same groups table, then
// each tile is an exact i8 x i8 -> i32 contraction over its 32 K slots.
// CHECK-LABEL: func.func @lower
// CHECK-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x32xi8>, %[[V:.*]]: tensor<1x1x1x64x16xi8>)
// CHECK: %[[TABLE:.*]] = arith.constant dense<{{\[\[}}0, 1, 2, 3, 4, 5, 6, 7, 16, {{.*}}> : tensor<2x32xi64>
// CHECK: %[[VG:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<1x1x1x2x32x16xi8>)
// CHECK:   %[[G:.*]] = linalg.index 3 : index
// CHECK:   %[[K:.*]] = linalg.index 4 : index
// CHECK:   %[[T64:.*]] = tensor.extract %[[TABLE]][%[[G]], %[[K]]] : tensor<2x32xi64>
// CHECK:   %[[T:.*]] = arith.index_cast %[[T64]] : i64 to index
// CHECK:   tensor.extract %[[V]][%{{.*}}, %{{.*}}, %{{.*}}, %[[T]], %{{.*}}] : tensor<1x1x1x64x16xi8>
// CHECK: %[[ACC:.*]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%[[WQ]], %[[VG]] : tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x2x32x16xi8>)
// CHECK:   arith.extsi
// CHECK:   arith.extsi
// CHECK:   arith.muli
// CHECK:   arith.addi
// CHECK: } -> tensor<1x1x4x1x2x16xi32>
// CHECK: return %[[ACC]]
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @lower(%wq: tensor<1x1x4x1x2x32xi8>, %v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32> {
  %acc = "int8attn.mmac_tiles"(%wq, %v) {groups = #groups, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32>
  return %acc : tensor<1x1x4x1x2x16xi32>
}
