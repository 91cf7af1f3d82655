// RUN: int8attn-opt %s -p "quantize-w-groups{w-quant=s8 w-terms=1}" | filecheck %s
// RUN: int8attn-opt %s -p "quantize-w-groups{fragment-model=gfx942 w-quant=s8 w-terms=1}" | filecheck %s
// RUN: int8attn-opt %s -p "quantize-w-groups{w-quant=u8 w-terms=1}" | filecheck %s --check-prefix=U8
// RUN: int8attn-opt %s -p "quantize-w-groups{w-quant=u8 w-terms=2}" | filecheck %s --check-prefix=TWO
// RUN: int8attn-opt %s -p "quantize-w-groups{w-quant=s8 w-terms=2}" | filecheck %s --check-prefix=TWO-S8
// RUN: int8attn-opt %s -p "quantize-w-groups{w-quant=s8 w-terms=1 w-chain=2}" | filecheck %s --check-prefix=CHAIN
// RUN: int8attn-opt %s -p "quantize-w-groups{w-quant=u8 w-terms=2 w-chain=4}" | filecheck %s --check-prefix=CHAIN4
// RUN: int8attn-opt %s -p "quantize-w-groups{w-quant=s8 w-terms=1 w-chain=2 scale-groups=step}" | filecheck %s --check-prefix=STEP
// The pass alone takes the named pipeline's defaults, w-quant=u8 w-terms=2:
// RUN: int8attn-opt %s -p quantize-w-groups | filecheck %s --check-prefix=TWO

// One scale per (row, partition, MMAC group). The groups of a wave are the
// gfx936 MMAC's real token sets with 16-byte V loads:
// {0-7,16-23,32-39,48-55} and {8-15,24-31,40-47,56-63}.
// CHECK-LABEL: func.func @groups
// CHECK-SAME: (%[[W:.*]]: tensor<1x2x4x2x256xf32>, %[[V:.*]]: tensor<1x2x2x256x16xi8>, %[[ACC:.*]]: tensor<1x2x4x2x16xf32>)
// CHECK: %[[Q:.*]]:2 = "int8attn.group_quantize"(%[[W]])
// CHECK-SAME: groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>, array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>, array<i64: 64, 65, 66, 67, 68, 69, 70, 71, 80,
// CHECK-SAME: : (tensor<1x2x4x2x256xf32>) -> (tensor<1x2x4x2x8x32xi8>, tensor<1x2x4x2x8xf32>)
// The sums go on into folded_pv's acc.
// CHECK: %[[O:.*]] = "int8attn.grouped_pv"(%[[Q]]#0, %[[Q]]#1, %[[V]], %[[ACC]])
// CHECK-SAME: groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16,
// CHECK-SAME: -> tensor<1x2x4x2x16xf32>
// CHECK: return %[[O]]

// Unsigned W: the same groups, w_quant = "u8", and the column sums of V over
// exactly those groups as grouped_pv's last operand (the +128 * sum Vq offset).
// U8-LABEL: func.func @groups
// U8-SAME: (%[[W:.*]]: tensor<1x2x4x2x256xf32>, %[[V:.*]]: tensor<1x2x2x256x16xi8>, %[[ACC:.*]]: tensor<1x2x4x2x16xf32>)
// U8: %[[Q:.*]]:2 = "int8attn.group_quantize"(%[[W]])
// U8-SAME: groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16,
// U8-SAME: w_quant = "u8"
// U8: %[[CS:.*]] = "int8attn.column_sums"(%[[V]])
// U8-SAME: groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16,
// U8-SAME: : (tensor<1x2x2x256x16xi8>) -> tensor<1x2x2x8x16xi32>
// U8: %[[O:.*]] = "int8attn.grouped_pv"(%[[Q]]#0, %[[Q]]#1, %[[V]], %[[ACC]], %[[CS]])
// U8: return %[[O]]
// Two-term W: the first term as before (u8, with its column sums); the residual
// W - (Wq + 128) * sW in W's token order, one generic over W's token digits
// (wave, r, t, j) reading Wq and sW through views of their group (wave, t) and
// slot (r, j) digits, no gather; a second, signed group_quantize of it over the
// same groups, its own grouped_pv without column sums, accumulating into the first's
// result (the second term's groups go on in the first's chain: no add).
// The loops run over W's token digits (wave, r, t, j); Wq is read at its group
// (wave, t) and slot (r, j), sW at its group:
// TWO-DAG: #[[WQMAP:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4, d6, d5, d7)>
// TWO-DAG: #[[SMAP:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4, d6)>
// TWO-LABEL: func.func @groups
// TWO-SAME: (%[[W:.*]]: tensor<1x2x4x2x256xf32>, %[[V:.*]]: tensor<1x2x2x256x16xi8>, %[[ACC:.*]]: tensor<1x2x4x2x16xf32>)
// TWO: %[[Q:.*]]:2 = "int8attn.group_quantize"(%[[W]])
// TWO-SAME: w_quant = "u8"
// TWO: %[[CS:.*]] = "int8attn.column_sums"(%[[V]])
// TWO: %[[O1:.*]] = "int8attn.grouped_pv"(%[[Q]]#0, %[[Q]]#1, %[[V]], %[[ACC]], %[[CS]])
// TWO-DAG: %[[WQ1:.*]] = tensor.expand_shape %[[Q]]#0 {{.*}} into tensor<1x2x4x2x8x4x8xi8>
// TWO-DAG: %[[WQ:.*]] = tensor.expand_shape %[[WQ1]] {{.*}} into tensor<1x2x4x2x4x2x4x8xi8>
// TWO-DAG: %[[WV:.*]] = tensor.expand_shape %[[W]] {{.*}} into tensor<1x2x4x2x4x4x2x8xf32>
// TWO-DAG: %[[SV:.*]] = tensor.expand_shape %[[Q]]#1 {{.*}} into tensor<1x2x4x2x4x2xf32>
// TWO: %[[RV:.*]] = linalg.generic {indexing_maps = [#{{.*}}, #[[WQMAP]], #[[SMAP]], #{{.*}}]{{.*}} ins(%[[WV]], %[[WQ]], %[[SV]] :
// TWO-NOT: tensor.extract
// TWO: %[[LEVEL:.*]] = arith.addi %{{.*}}, %c128_i32 : i32
// TWO: %[[F:.*]] = arith.sitofp %[[LEVEL]] : i32 to f32
// TWO: %[[NEG:.*]] = arith.negf %[[F]] : f32
// TWO: math.fma %[[NEG]], %{{.*}}, %{{.*}} : f32
// TWO: %[[R:.*]] = tensor.collapse_shape %[[RV]] {{.*}} into tensor<1x2x4x2x256xf32>
// TWO: %[[Q2:.*]]:2 = "int8attn.group_quantize"(%[[R]])
// TWO-SAME: groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16,
// TWO-NOT: w_quant
// TWO-SAME: -> (tensor<1x2x4x2x8x32xi8>, tensor<1x2x4x2x8xf32>)
// TWO: %[[O:.*]] = "int8attn.grouped_pv"(%[[Q2]]#0, %[[Q2]]#1, %[[V]], %[[O1]])
// TWO-SAME: groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16,
// TWO-SAME: (tensor<1x2x4x2x8x32xi8>, tensor<1x2x4x2x8xf32>, tensor<1x2x2x256x16xi8>, tensor<1x2x4x2x16xf32>)
// TWO-NOT: arith.addf
// TWO: return %[[O]]

// Two-term W over s8: the level is Wq itself (no +128), no column sums.
// TWO-S8-LABEL: func.func @groups
// TWO-S8-NOT: column_sums
// TWO-S8: %[[Q:.*]]:2 = "int8attn.group_quantize"
// TWO-S8: %[[O1:.*]] = "int8attn.grouped_pv"(%[[Q]]#0, %[[Q]]#1, %{{[^,]*}}, %{{[^,]*}})
// TWO-S8: linalg.generic
// TWO-S8: %[[LEVEL:.*]] = arith.extsi %{{.*}} : i8 to i32
// TWO-S8-NEXT: %[[F:.*]] = arith.sitofp %[[LEVEL]] : i32 to f32
// TWO-S8: "int8attn.group_quantize"
// TWO-S8: "int8attn.grouped_pv"(%{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %[[O1]])
// TWO-S8-NOT: arith.addf
// w-chain=2: one group per chain of two MMACs, a wave's 64 tokens, MMAC 0's K
// slots then MMAC 1's; one scale each (4 per 256-token partition).
// CHAIN-LABEL: func.func @groups
// CHAIN: %[[Q:.*]]:2 = "int8attn.group_quantize"
// CHAIN-SAME: groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>, array<i64: 64, 65,
// CHAIN-NOT: scale_groups
// CHAIN-SAME: -> (tensor<1x2x4x2x4x64xi8>, tensor<1x2x4x2x4xf32>)
// CHAIN: "int8attn.grouped_pv"(%[[Q]]#0, %[[Q]]#1
// CHAIN-SAME: groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55, 8, 9,
// w-chain=4 with unsigned two-term W: 128-token groups (two waves' MMACs), the
// column sums over the same chains, the second term's groups the same.
// CHAIN4-LABEL: func.func @groups
// CHAIN4: "int8attn.group_quantize"
// CHAIN4-SAME: -> (tensor<1x2x4x2x2x128xi8>, tensor<1x2x4x2x2xf32>)
// CHAIN4: "int8attn.column_sums"
// CHAIN4-SAME: groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65,
// CHAIN4-SAME: -> tensor<1x2x2x2x16xi32>
// CHAIN4: "int8attn.group_quantize"
// CHAIN4-SAME: -> (tensor<1x2x4x2x2x128xi8>, tensor<1x2x4x2x2xf32>)
// scale-groups=step: each chain's scale over its first MMAC's 32 tokens only (the
// mistake verify-scale-groups refuses).
// STEP-LABEL: func.func @groups
// STEP: "int8attn.group_quantize"
// STEP-SAME: scale_groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>, array<i64: 64,
// STEP-SAME: -> (tensor<1x2x4x2x4x64xi8>, tensor<1x2x4x2x4xf32>)
func.func @groups(%w: tensor<1x2x4x2x256xf32>, %v: tensor<1x2x2x256x16xi8>, %acc: tensor<1x2x4x2x16xf32>) -> tensor<1x2x4x2x16xf32> {
  %o = "int8attn.folded_pv"(%w, %v, %acc) : (tensor<1x2x4x2x256xf32>, tensor<1x2x2x256x16xi8>, tensor<1x2x4x2x16xf32>) -> tensor<1x2x4x2x16xf32>
  return %o : tensor<1x2x4x2x16xf32>
}
