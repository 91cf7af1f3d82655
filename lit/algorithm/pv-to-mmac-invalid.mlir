// RUN: not int8attn-opt %s -p pv-to-mmac 2>&1 | filecheck %s

// The MMAC's N (16) is the head dim per instruction: D = 24 does not tile.
// CHECK: pv-to-mmac-invalid.mlir:[[# @LINE + 4]]:8: error: head dim 24 is not a multiple of N=16 of gfx936's v_mmac_i32_16x16x32_i8, which computes 16 head-dim columns at a time; pad D to 32 with zero columns, or use a float PV (--pv bf16 or --pv f32)
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @head_dim_24(%wq: tensor<1x1x4x1x2x32xi8>, %sw: tensor<1x1x4x1x2xf32>, %v: tensor<1x1x1x64x24xi8>, %acc: tensor<1x1x4x1x24xf32>) -> tensor<1x1x4x1x24xf32> {
  %o = "int8attn.grouped_pv"(%wq, %sw, %v, %acc) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x24xi8>, tensor<1x1x4x1x24xf32>) -> tensor<1x1x4x1x24xf32>
  return %o : tensor<1x1x4x1x24xf32>
}
