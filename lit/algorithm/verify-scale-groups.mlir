// RUN: int8attn-opt %s --split-input-file -p verify-scale-groups | filecheck %s
// RUN: int8attn-opt %s --split-input-file -p "verify-scale-groups,pv-to-mmac,verify-scale-groups" | filecheck %s --check-prefix=TILES

// Scales over the MMAC's real sets, V read through the same table: accepted
// and left unchanged.
// CHECK-LABEL: func.func @fragment_groups
// CHECK: "int8attn.group_quantize"
// CHECK: "int8attn.grouped_pv"
// TILES-LABEL: func.func @fragment_groups
// TILES: "int8attn.mmac_tiles"
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @fragment_groups(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %o = "int8attn.grouped_pv"(%q#0, %q#1, %v, %acc) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// Unsigned W: column sums of the consumer's V over the MMAC's token sets
// (row order within a group does not matter for a sum): accepted, before and
// after pv-to-mmac.
// CHECK-LABEL: func.func @unsigned_column_sums
// CHECK: %[[CS:.*]] = "int8attn.column_sums"
// CHECK: "int8attn.grouped_pv"(%{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %[[CS]])
// TILES-LABEL: func.func @unsigned_column_sums
// TILES: %[[CS:.*]] = "int8attn.column_sums"
// TILES: "int8attn.mmac_tiles"(%{{.*}}, %{{.*}}, %[[CS]])
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
#reordered = [array<i64: 55, 54, 53, 52, 51, 50, 49, 48, 39, 38, 37, 36, 35, 34, 33, 32, 23, 22, 21, 20, 19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0>,
              array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @unsigned_column_sums(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups, w_quant = "u8"} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %cs = "int8attn.column_sums"(%v) {groups = #reordered} : (tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x2x16xi32>
  %o = "int8attn.grouped_pv"(%q#0, %q#1, %v, %acc, %cs) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>, tensor<1x1x1x2x16xi32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// w-chain=2 after pv-to-mmac: one accumulator sums the two MMACs of a wave (its
// 64 tokens, MMAC 0's K slots then MMAC 1's); the scale and the column sums cover
// exactly that set: accepted.
// CHECK-LABEL: func.func @chained_tiles
// CHECK: "int8attn.mmac_tiles"
// CHECK-SAME: chain = 2
// TILES-LABEL: func.func @chained_tiles
// TILES: "int8attn.mmac_tiles"
// TILES-SAME: chain = 2
#chain = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @chained_tiles(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x1x16xi32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #chain, w_quant = "u8"} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x1x64xi8>, tensor<1x1x4x1x1xf32>)
  %cs = "int8attn.column_sums"(%v) {groups = #chain} : (tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x1x16xi32>
  %acc = "int8attn.mmac_tiles"(%q#0, %v, %cs) {groups = #chain, fragment_model = "gfx936", chain = 2} : (tensor<1x1x4x1x1x64xi8>, tensor<1x1x1x64x16xi8>, tensor<1x1x1x1x16xi32>) -> tensor<1x1x4x1x1x16xi32>
  return %acc : tensor<1x1x4x1x1x16xi32>
}
