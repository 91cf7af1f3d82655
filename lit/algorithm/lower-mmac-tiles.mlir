// RUN: int8attn-opt %s --split-input-file -p lower-mmac-tiles | filecheck %s
// RUN: int8attn-opt %s --split-input-file -p "lower-mmac-tiles{tokens=gather}" | filecheck %s --check-prefix=GATHER
// RUN: int8attn-opt %s --split-input-file -p "lower-mmac-tiles{contraction=mmt4d vector-isa=avx512}" | filecheck %s --check-prefix=MMT4D
// RUN: int8attn-opt %s --split-input-file -p "lower-mmac-tiles{contraction=mmt4d vector-isa=avx}" | filecheck %s --check-prefix=AVX
// RUN: int8attn-opt %s --split-input-file -p "lower-mmac-tiles{contraction=mmt4d}" | filecheck %s --check-prefix=SSE

// gfx936, one 64-token wave: token = 16*r + 8*t + j, MMAC t consumes K slot
// 8*r + j. V is read in place (no gather, no copy): its 64 tokens are one
// reduction loop, and Wq is spread over them (as f32) with a zero wherever the
// token's t is not the group's. The contraction's loops end in (r, d, tok);
// it accumulates in f32, exact for int8 products (every partial sum is an
// integer below 2^24), and converts the sums to i32.
// CHECK-DAG: #[[WQ_READ:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d4, d2, d3, d5, d7)>
// CHECK-DAG: #[[WZ_READ:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1, d2, d3, d4, d6)>
// CHECK-DAG: #[[V_READ:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1, d2, d6, d5)>
// CHECK-DAG: #[[ACC_WRITE:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1, d4, d2, d3, d5)>
// CHECK-LABEL: func.func @wave
// CHECK-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x32xi8>, %[[V:.*]]: tensor<1x1x1x64x16xi8>)
// CHECK-NOT: tensor.extract
// CHECK: %[[WQ_RJ:.*]] = tensor.expand_shape %[[WQ]] {{\[\[}}0], [1], [2], [3], [4], [5, 6]] output_shape [1, 1, 4, 1, 2, 4, 8]
// CHECK: %[[WZ:.*]] = linalg.generic {indexing_maps = [#[[WQ_READ]], #{{.*}}], {{.*}} ins(%[[WQ_RJ]] : tensor<1x1x4x1x2x4x8xi8>) outs(%{{.*}} : tensor<1x1x1x2x4x4x2x8xf32>)
// CHECK:   %[[W:.*]] = arith.sitofp %{{.*}} : i8 to f32
// CHECK:   %[[GROUP_T:.*]] = linalg.index 3 : index
// CHECK:   %[[TOKEN_T:.*]] = linalg.index 6 : index
// CHECK:   %[[OWN:.*]] = arith.cmpi eq, %[[GROUP_T]], %[[TOKEN_T]] : index
// CHECK:   arith.select %[[OWN]], %[[W]], %{{.*}} : f32
// CHECK: %[[WZ_TOK:.*]] = tensor.collapse_shape %[[WZ]] {{\[\[}}0], [1], [2], [3], [4], [5, 6, 7]] : tensor<1x1x1x2x4x4x2x8xf32> into tensor<1x1x1x2x4x64xf32>
// CHECK: %[[SUMS:.*]] = linalg.generic {indexing_maps = [#[[WZ_READ]], #[[V_READ]], #[[ACC_WRITE]]], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%[[WZ_TOK]], %[[V]] : tensor<1x1x1x2x4x64xf32>, tensor<1x1x1x64x16xi8>) outs(%{{.*}} : tensor<1x1x4x1x2x16xf32>)
// CHECK:   ^bb0(%[[WI:.*]]: f32, %[[VI:.*]]: i8, %[[TOTAL:.*]]: f32):
// CHECK:   %[[VF:.*]] = arith.sitofp %[[VI]] : i8 to f32
// CHECK:   %[[P:.*]] = arith.mulf %[[WI]], %[[VF]] : f32
// CHECK:   arith.addf %[[TOTAL]], %[[P]] : f32
// CHECK: %[[ACC:.*]] = linalg.generic {{.*}} ins(%[[SUMS]] : tensor<1x1x4x1x2x16xf32>) outs(%{{.*}} : tensor<1x1x4x1x2x16xi32>)
// CHECK:   arith.fptosi %{{.*}} : f32 to i32
// CHECK: return %[[ACC]]
// contraction=mmt4d: each group's int32 sum is one tile of a linalg.batch_mmt4d (i16
// operands, the int8 values exact): V is packed once through a view of its
// token digits (fragments.token_axes), each group's 32 tokens contiguous in K
// slot order (r, j1) with K0 = j0 pairs interleaved per head-dim column (N0 =
// 16); Wq is packed as [group, M1, K1, M0 rows, K0]; the [group, M1, N1, M0,
// N0] sums come back as [r, g, d]. No gather, no f32.
// MMT4D-DAG: #[[WQ_READ:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d4, d6, d2, d3, d5, d7)>
// MMT4D-DAG: #[[V_READ:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7, d8) -> (d0, d1, d2, d5, d3, d6, d8, d4, d7)>
// MMT4D-DAG: #[[TILES_READ:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d4, d5, d2, d6, d3, d7)>
// MMT4D-LABEL: func.func @wave
// MMT4D-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x32xi8>, %[[V:.*]]: tensor<1x1x1x64x16xi8>)
// MMT4D-NOT: tensor.extract
// MMT4D: %[[WQ_K0:.*]] = tensor.expand_shape %[[WQ]] {{\[\[}}0], [1], [2], [3], [4], [5, 6]] output_shape [1, 1, 4, 1, 2, 16, 2]
// MMT4D: %[[WQ_M0:.*]] = tensor.expand_shape %[[WQ_K0]] {{\[\[}}0], [1], [2, 3], [4], [5], [6], [7]] output_shape [1, 1, 1, 4, 1, 2, 16, 2]
// MMT4D: %[[W16:.*]] = linalg.generic {indexing_maps = [#[[WQ_READ]], #{{.*}}], {{.*}} ins(%[[WQ_M0]] : tensor<1x1x1x4x1x2x16x2xi8>) outs(%{{.*}} : tensor<1x1x1x2x1x16x4x2xi16>)
// MMT4D:   arith.extsi %{{.*}} : i8 to i16
// MMT4D: %[[LHS:.*]] = tensor.collapse_shape %[[W16]] {{\[\[}}0, 1, 2, 3], [4], [5], [6], [7]] : tensor<1x1x1x2x1x16x4x2xi16> into tensor<2x1x16x4x2xi16>
// MMT4D: %[[V_D:.*]] = tensor.expand_shape %[[V]] {{\[\[}}0], [1], [2], [3], [4, 5]] output_shape [1, 1, 1, 64, 1, 16]
// MMT4D: %[[V_DIGITS:.*]] = tensor.expand_shape %[[V_D]] {{\[\[}}0], [1], [2], [3, 4, 5, 6], [7], [8]] output_shape [1, 1, 1, 4, 2, 4, 2, 1, 16]
// MMT4D: %[[V16:.*]] = linalg.generic {indexing_maps = [#[[V_READ]], #{{.*}}], {{.*}} ins(%[[V_DIGITS]] : tensor<1x1x1x4x2x4x2x1x16xi8>) outs(%{{.*}} : tensor<1x1x1x2x1x4x4x16x2xi16>)
// MMT4D:   arith.extsi %{{.*}} : i8 to i16
// MMT4D: %[[V_K1:.*]] = tensor.collapse_shape %[[V16]] {{\[\[}}0], [1], [2], [3], [4], [5, 6], [7], [8]]
// MMT4D: %[[RHS:.*]] = tensor.collapse_shape %[[V_K1]] {{\[\[}}0, 1, 2, 3], [4], [5], [6], [7]] : tensor<1x1x1x2x1x16x16x2xi16> into tensor<2x1x16x16x2xi16>
// MMT4D: %[[TILES:.*]] = linalg.batch_mmt4d ins(%[[LHS]], %[[RHS]] : tensor<2x1x16x4x2xi16>, tensor<2x1x16x16x2xi16>) outs(%{{.*}} : tensor<2x1x1x4x16xi32>)
// MMT4D: %[[GROUPS:.*]] = tensor.expand_shape %[[TILES]] {{\[\[}}0, 1, 2, 3], [4], [5], [6], [7]] output_shape [1, 1, 1, 2, 1, 1, 4, 16]
// MMT4D: %[[SUMS:.*]] = linalg.generic {indexing_maps = [#[[TILES_READ]], #{{.*}}], {{.*}} ins(%[[GROUPS]] : tensor<1x1x1x2x1x1x4x16xi32>) outs(%{{.*}} : tensor<1x1x1x4x1x2x1x16xi32>)
// MMT4D: %[[SUMS_D:.*]] = tensor.collapse_shape %[[SUMS]]
// MMT4D: %[[ACC:.*]] = tensor.collapse_shape %[[SUMS_D]] {{.*}} into tensor<1x1x4x1x2x16xi32>
// MMT4D: return %[[ACC]]
// GATHER-LABEL: func.func @wave
// GATHER: tensor.extract
// GATHER: arith.muli
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @wave(%wq: tensor<1x1x4x1x2x32xi8>, %v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32> {
  %acc = "int8attn.mmac_tiles"(%wq, %v) {groups = #groups, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32>
  return %acc : tensor<1x1x4x1x2x16xi32>
}

// -----

// cuda, two waves (128 tokens): token = 64*wave + 16*r + 8*t + 4*h + j, group
// (wave, t), K slot 16*h + 4*r + j. The waves are a batch loop of a view of V
// ([2, 64] tokens); Wq's K splits as [h, r, j] = [2, 4, 4] and is spread over
// each wave's (r, t, h, j) tokens; the sums come back as [G = (wave, t), D].
// CHECK-DAG: #[[WQ_READ:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7, d8, d9) -> (d0, d1, d5, d2, d3, d4, d8, d6, d9)>
// CHECK-DAG: #[[V_READ:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d7, d6)>
// CHECK-LABEL: func.func @two_waves
// CHECK-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x4x32xi8>, %[[V:.*]]: tensor<1x1x1x128x16xi8>)
// CHECK-NOT: tensor.extract
// CHECK: %[[WQ_HRJ:.*]] = tensor.expand_shape %[[WQ]] {{.*}} output_shape [1, 1, 4, 1, 4, 2, 4, 4]
// CHECK: %[[WQ_DIGITS:.*]] = tensor.expand_shape %[[WQ_HRJ]] {{.*}} output_shape [1, 1, 4, 1, 2, 2, 2, 4, 4]
// CHECK: %[[WZ:.*]] = linalg.generic {indexing_maps = [#[[WQ_READ]], #{{.*}}], {{.*}} ins(%[[WQ_DIGITS]] : {{.*}}) outs(%{{.*}} : tensor<1x1x1x2x2x4x4x2x2x4xf32>)
// CHECK:   %[[GROUP_T:.*]] = linalg.index 4 : index
// CHECK:   %[[TOKEN_T:.*]] = linalg.index 7 : index
// CHECK:   arith.cmpi eq, %[[GROUP_T]], %[[TOKEN_T]] : index
// CHECK: %[[WZ_TOK:.*]] = tensor.collapse_shape %[[WZ]] {{.*}} into tensor<1x1x1x2x2x4x64xf32>
// CHECK: %[[V_WAVES:.*]] = tensor.expand_shape %[[V]] {{\[\[}}0], [1], [2], [3, 4], [5]] output_shape [1, 1, 1, 2, 64, 16]
// CHECK: %[[SUMS:.*]] = linalg.generic {indexing_maps = [#{{.*}}, #[[V_READ]], #{{.*}}], {{.*}} ins(%[[WZ_TOK]], %[[V_WAVES]] : tensor<1x1x1x2x2x4x64xf32>, tensor<1x1x1x2x64x16xi8>) outs(%{{.*}} : tensor<1x1x4x1x2x2x16xf32>)
// CHECK: %[[ACC:.*]] = linalg.generic {{.*}} ins(%[[SUMS]] : {{.*}}) outs(%{{.*}} : tensor<1x1x4x1x2x2x16xi32>)
// CHECK: %[[G:.*]] = tensor.collapse_shape %[[ACC]] {{\[\[}}0], [1], [2], [3], [4, 5], [6]] : tensor<1x1x4x1x2x2x16xi32> into tensor<1x1x4x1x4x16xi32>
// CHECK: return %[[G]]
// contraction=mmt4d: V's token digits (wave, r, t, h, j1, j0) are packed into
// [group (wave, t), N1, K1 (h, r, j1), N0, K0 (j0)]; the four groups are the
// mmt4d's batch, their sums come back as [G = (wave, t), D].
// MMT4D-DAG: #[[V_READ:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10) -> (d0, d1, d2, d3, d7, d4, d6, d8, d10, d5, d9)>
// MMT4D-LABEL: func.func @two_waves
// MMT4D-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x4x32xi8>, %[[V:.*]]: tensor<1x1x1x128x16xi8>)
// MMT4D-NOT: tensor.extract
// MMT4D: %[[W16:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<1x1x1x4x1x16x4x2xi16>)
// MMT4D: %[[LHS:.*]] = tensor.collapse_shape %[[W16]] {{.*}} into tensor<4x1x16x4x2xi16>
// MMT4D: %[[V_D:.*]] = tensor.expand_shape %[[V]] {{.*}} output_shape [1, 1, 1, 128, 1, 16]
// MMT4D: %[[V_DIGITS:.*]] = tensor.expand_shape %[[V_D]] {{\[\[}}0], [1], [2], [3, 4, 5, 6, 7, 8], [9], [10]] output_shape [1, 1, 1, 2, 4, 2, 2, 2, 2, 1, 16]
// MMT4D: %[[V16:.*]] = linalg.generic {indexing_maps = [#[[V_READ]], #{{.*}}], {{.*}} ins(%[[V_DIGITS]] : {{.*}}) outs(%{{.*}} : tensor<1x1x1x2x2x1x2x4x2x16x2xi16>)
// MMT4D: %[[V_K1:.*]] = tensor.collapse_shape %[[V16]] {{.*}} into tensor<1x1x1x2x2x1x16x16x2xi16>
// MMT4D: %[[RHS:.*]] = tensor.collapse_shape %[[V_K1]] {{.*}} into tensor<4x1x16x16x2xi16>
// MMT4D: %[[TILES:.*]] = linalg.batch_mmt4d ins(%[[LHS]], %[[RHS]] : tensor<4x1x16x4x2xi16>, tensor<4x1x16x16x2xi16>) outs(%{{.*}} : tensor<4x1x1x4x16xi32>)
// MMT4D: %[[GROUPS:.*]] = tensor.expand_shape %[[TILES]] {{.*}} output_shape [1, 1, 1, 4, 1, 1, 4, 16]
// MMT4D: %[[SUMS:.*]] = linalg.generic {{.*}} ins(%[[GROUPS]] : {{.*}}) outs(%{{.*}} : tensor<1x1x1x4x1x4x1x16xi32>)
// MMT4D: %[[SUMS_D:.*]] = tensor.collapse_shape %[[SUMS]]
// MMT4D: %[[G:.*]] = tensor.collapse_shape %[[SUMS_D]] {{.*}} into tensor<1x1x4x1x4x16xi32>
// MMT4D: return %[[G]]
#groups = [array<i64: 0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51, 4, 5, 6, 7, 20, 21, 22, 23, 36, 37, 38, 39, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 24, 25, 26, 27, 40, 41, 42, 43, 56, 57, 58, 59, 12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63>,
           array<i64: 64, 65, 66, 67, 80, 81, 82, 83, 96, 97, 98, 99, 112, 113, 114, 115, 68, 69, 70, 71, 84, 85, 86, 87, 100, 101, 102, 103, 116, 117, 118, 119>,
           array<i64: 72, 73, 74, 75, 88, 89, 90, 91, 104, 105, 106, 107, 120, 121, 122, 123, 76, 77, 78, 79, 92, 93, 94, 95, 108, 109, 110, 111, 124, 125, 126, 127>]
func.func @two_waves(%wq: tensor<1x1x4x1x4x32xi8>, %v: tensor<1x1x1x128x16xi8>) -> tensor<1x1x4x1x4x16xi32> {
  %acc = "int8attn.mmac_tiles"(%wq, %v) {groups = #groups, fragment_model = "cuda"} : (tensor<1x1x4x1x4x32xi8>, tensor<1x1x1x128x16xi8>) -> tensor<1x1x4x1x4x16xi32>
  return %acc : tensor<1x1x4x1x4x16xi32>
}

// -----

// A table that is no permutation of the token index's digits (token 31 and
// 63 trade groups) still lowers: V is gathered into fragment order through
// the same table, then each tile is an exact i8 x i8 -> i32 contraction.
// CHECK-LABEL: func.func @no_digit_permutation
// CHECK-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x32xi8>, %[[V:.*]]: tensor<1x1x1x64x16xi8>)
// CHECK: %[[TABLE:.*]] = arith.constant dense<{{\[\[}}0, 1, 2, {{.*}}, 30, 63], [31, 32, {{.*}}> : tensor<2x32xi64>
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
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 63>,
           array<i64: 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62>]
func.func @no_digit_permutation(%wq: tensor<1x1x4x1x2x32xi8>, %v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32> {
  %acc = "int8attn.mmac_tiles"(%wq, %v) {groups = #groups, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32>
  return %acc : tensor<1x1x4x1x2x16xi32>
}

// -----

// Unsigned W: in place, the tile sums u * Vq itself (u = Wq + 128 in [0, 255],
// added where Wq becomes f32; K * 255 * 128 < 2^24, still exact in f32), which
// is sum Wq*Vq + 128 sum Vq bit for bit: the column sums op, now unused, is
// erased, and V is read once. The gather form adds 128 * cs after its i32
// contraction.
// CHECK-LABEL: func.func @unsigned_wave
// CHECK-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x32xi8>, %[[V:.*]]: tensor<1x1x1x64x16xi8>)
// CHECK-DAG: %[[C128:.*]] = arith.constant 1.280000e+02 : f32
// CHECK-NOT: int8attn.column_sums
// CHECK-NOT: arith.extsi
// CHECK: %[[WZ:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<1x1x1x2x4x4x2x8xf32>)
// CHECK:   %[[W:.*]] = arith.sitofp %{{.*}} : i8 to f32
// CHECK:   %[[U:.*]] = arith.addf %[[W]], %[[C128]] : f32
// CHECK:   arith.select %{{.*}}, %[[U]], %{{.*}} : f32
// CHECK: %[[WZ_TOK:.*]] = tensor.collapse_shape %[[WZ]]
// CHECK: %[[SUMS:.*]] = linalg.generic {{.*}} ins(%[[WZ_TOK]], %[[V]] : tensor<1x1x1x2x4x64xf32>, tensor<1x1x1x64x16xi8>) outs(%{{.*}} : tensor<1x1x4x1x2x16xf32>)
// CHECK: %[[ACC:.*]] = linalg.generic {{.*}} ins(%[[SUMS]] : tensor<1x1x4x1x2x16xf32>) outs(%{{.*}} : tensor<1x1x4x1x2x16xi32>)
// CHECK:   arith.fptosi %{{.*}} : f32 to i32
// CHECK-NOT: arith.muli
// CHECK: return %[[ACC]]
// contraction=mmt4d: u = Wq + 128 is added where Wq becomes i16 (exact in the
// int32 sums); no column sums, no i32 multiply outside the mmt4d.
// MMT4D-LABEL: func.func @unsigned_wave
// MMT4D-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x32xi8>, %[[V:.*]]: tensor<1x1x1x64x16xi8>)
// MMT4D-DAG: %[[C128:.*]] = arith.constant 128 : i16
// MMT4D-NOT: int8attn.column_sums
// MMT4D: %[[W16:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<1x1x1x2x1x16x4x2xi16>)
// MMT4D:   %[[W:.*]] = arith.extsi %{{.*}} : i8 to i16
// MMT4D:   %[[U:.*]] = arith.addi %[[W]], %[[C128]] : i16
// MMT4D:   linalg.yield %[[U]] : i16
// MMT4D: %[[LHS:.*]] = tensor.collapse_shape %[[W16]]
// MMT4D: %[[V16:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<1x1x1x2x1x4x4x16x2xi16>)
// MMT4D-NOT: arith.addi
// MMT4D: %[[TILES:.*]] = linalg.batch_mmt4d ins(%[[LHS]], %{{.*}} : tensor<2x1x16x4x2xi16>, tensor<2x1x16x16x2xi16>)
// MMT4D-NOT: arith.muli
// MMT4D: %[[ACC:.*]] = tensor.collapse_shape %{{.*}} into tensor<1x1x4x1x2x16xi32>
// MMT4D: return %[[ACC]]
// GATHER-LABEL: func.func @unsigned_wave
// GATHER: %[[CS:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<1x1x1x2x16xi32>)
// GATHER: %[[ACC:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<1x1x4x1x2x16xi32>)
// GATHER: linalg.generic {{.*}} ins(%[[ACC]], %[[CS]] : tensor<1x1x4x1x2x16xi32>, tensor<1x1x1x2x16xi32>)
// GATHER:   arith.muli %{{.*}}, %{{.*}} : i32
// GATHER:   arith.addi
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @unsigned_wave(%wq: tensor<1x1x4x1x2x32xi8>, %v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32> {
  %cs = "int8attn.column_sums"(%v) {groups = #groups} : (tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x2x16xi32>
  %acc = "int8attn.mmac_tiles"(%wq, %v, %cs) {groups = #groups, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>, tensor<1x1x1x2x16xi32>) -> tensor<1x1x4x1x2x16xi32>
  return %acc : tensor<1x1x4x1x2x16xi32>
}

// -----

// Column sums that something else also reads are lowered on their own: one
// i32 reduction of V in place over the slot digits (r, j) of each group t.
// CHECK-DAG: #[[V_DIGITS:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1, d2, d5, d3, d6, d4)>
// CHECK-DAG: #[[CS_WRITE:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1, d2, d3, d4)>
// CHECK-LABEL: func.func @column_sums_kept
// CHECK-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x32xi8>, %[[V:.*]]: tensor<1x1x1x64x16xi8>)
// CHECK: %[[VIEW:.*]] = tensor.expand_shape %[[V]] {{\[\[}}0], [1], [2], [3, 4, 5], [6]] output_shape [1, 1, 1, 4, 2, 8, 16]
// CHECK: %[[CS:.*]] = linalg.generic {indexing_maps = [#[[V_DIGITS]], #[[CS_WRITE]]], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction"]} ins(%[[VIEW]] : tensor<1x1x1x4x2x8x16xi8>) outs(%{{.*}} : tensor<1x1x1x2x16xi32>)
// CHECK:   %[[X:.*]] = arith.extsi %{{.*}} : i8 to i32
// CHECK:   arith.addi %{{.*}}, %[[X]] : i32
// CHECK: %[[ACC:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<1x1x4x1x2x16xi32>)
// CHECK: return %[[ACC]], %[[CS]]
// MMT4D-LABEL: func.func @column_sums_kept
// MMT4D: linalg.batch_mmt4d
// MMT4D: %[[ACC:.*]] = tensor.collapse_shape {{.*}} into tensor<1x1x4x1x2x16xi32>
// MMT4D: return %[[ACC]], %{{.*}}
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @column_sums_kept(%wq: tensor<1x1x4x1x2x32xi8>, %v: tensor<1x1x1x64x16xi8>) -> (tensor<1x1x4x1x2x16xi32>, tensor<1x1x1x2x16xi32>) {
  %cs = "int8attn.column_sums"(%v) {groups = #groups} : (tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x2x16xi32>
  %acc = "int8attn.mmac_tiles"(%wq, %v, %cs) {groups = #groups, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>, tensor<1x1x1x2x16xi32>) -> tensor<1x1x4x1x2x16xi32>
  return %acc, %cs : tensor<1x1x4x1x2x16xi32>, tensor<1x1x1x2x16xi32>
}

// -----

// The rescale of pv-to-mmac, sum_g f32(acc) * sW, reading the tile sums.
// contraction=mmt4d: it reads the batch_mmt4d result in its tile layout
// [b, h, n, g, M1, N1, M0, N0] itself: its loops over r and d are split into
// (M1, M0) and (N1, N0) (sW and the output viewed alike), so no transposed copy
// of the tiles back to [r, g, d] is left for IREE to materialise.
// MMT4D-DAG: #[[TILES_IN:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d4, d7, d2, d5, d3, d6)>
// MMT4D-DAG: #[[SW_IN:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4, d7)>
// MMT4D-DAG: #[[OUT_MAP:.*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4, d5, d6)>
// MMT4D-LABEL: func.func @rescale
// MMT4D-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x32xi8>, %[[V:.*]]: tensor<1x1x1x64x16xi8>, %[[SW:.*]]: tensor<1x1x4x1x2xf32>)
// MMT4D: %[[TILES:.*]] = linalg.batch_mmt4d
// MMT4D: %[[GROUPS:.*]] = tensor.expand_shape %[[TILES]] {{\[\[}}0, 1, 2, 3], [4], [5], [6], [7]] output_shape [1, 1, 1, 2, 1, 1, 4, 16]
// MMT4D-NOT: linalg.generic
// MMT4D: %[[SW_M:.*]] = tensor.expand_shape %[[SW]] {{\[\[}}0], [1], [2, 3], [4], [5]] output_shape [1, 1, 1, 4, 1, 2]
// MMT4D: %[[OUT:.*]] = linalg.generic {indexing_maps = [#[[TILES_IN]], #[[SW_IN]], #[[OUT_MAP]]], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%[[GROUPS]], %[[SW_M]] : tensor<1x1x1x2x1x1x4x16xi32>, tensor<1x1x1x4x1x2xf32>) outs(%{{.*}} : tensor<1x1x1x4x1x1x16xf32>)
// MMT4D:   arith.sitofp %{{.*}} : i32 to f32
// MMT4D:   arith.mulf
// MMT4D:   arith.addf
// MMT4D: %[[OUT_D:.*]] = tensor.collapse_shape %[[OUT]] {{\[\[}}0], [1], [2], [3], [4], [5, 6]] : tensor<1x1x1x4x1x1x16xf32> into tensor<1x1x1x4x1x16xf32>
// MMT4D: %[[RESULT:.*]] = tensor.collapse_shape %[[OUT_D]] {{\[\[}}0], [1], [2, 3], [4], [5]] : tensor<1x1x1x4x1x16xf32> into tensor<1x1x4x1x16xf32>
// MMT4D: return %[[RESULT]]
// CHECK-LABEL: func.func @rescale
// CHECK: linalg.generic {{.*}} ins(%{{.*}}, %{{.*}} : tensor<1x1x4x1x2x16xi32>, tensor<1x1x4x1x2xf32>)
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @rescale(%wq: tensor<1x1x4x1x2x32xi8>, %v: tensor<1x1x1x64x16xi8>, %sw: tensor<1x1x4x1x2xf32>) -> tensor<1x1x4x1x16xf32> {
  %acc = "int8attn.mmac_tiles"(%wq, %v) {groups = #groups, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32>
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<1x1x4x1x16xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32>
  %out = linalg.generic {indexing_maps = [affine_map<(b, h, r, n, d, g) -> (b, h, r, n, g, d)>, affine_map<(b, h, r, n, d, g) -> (b, h, r, n, g)>, affine_map<(b, h, r, n, d, g) -> (b, h, r, n, d)>], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%acc, %sw : tensor<1x1x4x1x2x16xi32>, tensor<1x1x4x1x2xf32>) outs(%init : tensor<1x1x4x1x16xf32>) {
  ^bb0(%a: i32, %s: f32, %o: f32):
    %f = arith.sitofp %a : i32 to f32
    %m = arith.mulf %f, %s : f32
    %t = arith.addf %o, %m : f32
    linalg.yield %t : f32
  } -> tensor<1x1x4x1x16xf32>
  return %out : tensor<1x1x4x1x16xf32>
}

// -----

// Two W terms over the same V and groups (w_terms=2; the first unsigned, with
// column sums): contraction=mmt4d gives them one batch_mmt4d, their Wq side by
// side in each row tile (M0 = 2 x 4 rows: each term widened, +128 for the
// unsigned one, stacked, packed by one copy), V packed once; each rescale reads
// its term's rows of the tiles (a slice of M0) in place, after the mmt4d.
// MMT4D-LABEL: func.func @two_terms
// MMT4D-SAME: (%[[WQ1:.*]]: tensor<1x1x4x1x2x32xi8>, %[[WQ2:.*]]: tensor<1x1x4x1x2x32xi8>, %[[V:.*]]: tensor<1x1x1x64x16xi8>, %[[SW1:.*]]: tensor<1x1x4x1x2xf32>, %[[SW2:.*]]: tensor<1x1x4x1x2xf32>)
// MMT4D-DAG: %[[C128:.*]] = arith.constant 128 : i16
// MMT4D-NOT: int8attn.column_sums
// MMT4D: %[[U1:.*]] = linalg.generic {{.*}} ins(%[[WQ1]] : tensor<1x1x4x1x2x32xi8>) outs(%{{.*}} : tensor<1x1x4x1x2x32xi16>)
// MMT4D:   arith.extsi
// MMT4D:   arith.addi %{{.*}}, %[[C128]] : i16
// MMT4D: %[[T1:.*]] = tensor.expand_shape %[[U1]]
// MMT4D: %[[W2:.*]] = linalg.generic {{.*}} ins(%[[WQ2]] : tensor<1x1x4x1x2x32xi8>) outs(%{{.*}} : tensor<1x1x4x1x2x32xi16>)
// MMT4D:   arith.extsi
// MMT4D-NOT: arith.addi
// MMT4D: %[[T2:.*]] = tensor.expand_shape %[[W2]]
// MMT4D: %[[STACKED:.*]] = tensor.concat dim(0) %[[T1]], %[[T2]] : {{.*}} -> tensor<2x1x1x4x1x2x32xi16>
// MMT4D: %[[LHS:.*]] = tensor.collapse_shape %{{.*}} into tensor<2x1x16x8x2xi16>
// MMT4D: %[[TILES:.*]] = linalg.batch_mmt4d ins(%[[LHS]], %{{.*}} : tensor<2x1x16x8x2xi16>, tensor<2x1x16x16x2xi16>) outs(%{{.*}} : tensor<2x1x1x8x16xi32>)
// MMT4D-NOT: linalg.batch_mmt4d
// MMT4D: %[[TERMS:.*]] = tensor.expand_shape %{{.*}} output_shape [1, 1, 1, 2, 1, 1, 2, 4, 16]
// MMT4D: %[[S1:.*]] = tensor.extract_slice %[[TERMS]][0, 0, 0, 0, 0, 0, 0, 0, 0] [1, 1, 1, 2, 1, 1, 1, 4, 16]
// MMT4D: %[[TILES1:.*]] = tensor.collapse_shape %[[S1]]
// MMT4D: %[[S2:.*]] = tensor.extract_slice %[[TERMS]][0, 0, 0, 0, 0, 0, 1, 0, 0] [1, 1, 1, 2, 1, 1, 1, 4, 16]
// MMT4D: %[[TILES2:.*]] = tensor.collapse_shape %[[S2]]
// MMT4D: %[[SW1_M:.*]] = tensor.expand_shape %[[SW1]]
// MMT4D: %[[O1:.*]] = linalg.generic {{.*}} ins(%[[TILES1]], %[[SW1_M]] : tensor<1x1x1x2x1x1x4x16xi32>, tensor<1x1x1x4x1x2xf32>)
// MMT4D: %[[SW2_M:.*]] = tensor.expand_shape %[[SW2]]
// MMT4D: %[[O2:.*]] = linalg.generic {{.*}} ins(%[[TILES2]], %[[SW2_M]] : tensor<1x1x1x2x1x1x4x16xi32>, tensor<1x1x1x4x1x2xf32>)
// MMT4D: linalg.generic {{.*}} ins(%{{.*}}, %{{.*}} : tensor<1x1x4x1x16xf32>, tensor<1x1x4x1x16xf32>)
// The tiles fit the register file IREE caps vector tiles by (IREE cuts a larger
// one, and its ukernel then sums the wrong elements): AVX/AVX2, 16 x 256 bits,
// holds 8 rows x 8 i32 columns, so the two terms still share 8-row tiles, two
// column tiles per 16-wide head dim; SSE (the default, safe on any x86-64),
// 16 x 128 bits, holds 8 x 4.
// AVX-LABEL: func.func @two_terms
// AVX: %[[TILES:.*]] = linalg.batch_mmt4d ins(%{{.*}}, %{{.*}} : tensor<2x1x16x8x2xi16>, tensor<2x2x16x8x2xi16>) outs(%{{.*}} : tensor<2x1x2x8x8xi32>)
// AVX-NOT: linalg.batch_mmt4d
// SSE-LABEL: func.func @two_terms
// SSE: %[[TILES:.*]] = linalg.batch_mmt4d ins(%{{.*}}, %{{.*}} : tensor<2x1x16x8x2xi16>, tensor<2x4x16x4x2xi16>) outs(%{{.*}} : tensor<2x1x4x8x4xi32>)
// SSE-NOT: linalg.batch_mmt4d
// CHECK-LABEL: func.func @two_terms
// CHECK-NOT: int8attn.column_sums
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
#acc = affine_map<(b, h, r, n, d, g) -> (b, h, r, n, g, d)>
#sw = affine_map<(b, h, r, n, d, g) -> (b, h, r, n, g)>
#out = affine_map<(b, h, r, n, d, g) -> (b, h, r, n, d)>
#id = affine_map<(b, h, r, n, d) -> (b, h, r, n, d)>
func.func @two_terms(%wq1: tensor<1x1x4x1x2x32xi8>, %wq2: tensor<1x1x4x1x2x32xi8>, %v: tensor<1x1x1x64x16xi8>, %sw1: tensor<1x1x4x1x2xf32>, %sw2: tensor<1x1x4x1x2xf32>) -> tensor<1x1x4x1x16xf32> {
  %cs = "int8attn.column_sums"(%v) {groups = #groups} : (tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x2x16xi32>
  %acc1 = "int8attn.mmac_tiles"(%wq1, %v, %cs) {groups = #groups, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>, tensor<1x1x1x2x16xi32>) -> tensor<1x1x4x1x2x16xi32>
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<1x1x4x1x16xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32>
  %o1 = linalg.generic {indexing_maps = [#acc, #sw, #out], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%acc1, %sw1 : tensor<1x1x4x1x2x16xi32>, tensor<1x1x4x1x2xf32>) outs(%init : tensor<1x1x4x1x16xf32>) {
  ^bb0(%a: i32, %s: f32, %o: f32):
    %f = arith.sitofp %a : i32 to f32
    %m = arith.mulf %f, %s : f32
    %t = arith.addf %o, %m : f32
    linalg.yield %t : f32
  } -> tensor<1x1x4x1x16xf32>
  %acc2 = "int8attn.mmac_tiles"(%wq2, %v) {groups = #groups, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32>
  %o2 = linalg.generic {indexing_maps = [#acc, #sw, #out], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%acc2, %sw2 : tensor<1x1x4x1x2x16xi32>, tensor<1x1x4x1x2xf32>) outs(%init : tensor<1x1x4x1x16xf32>) {
  ^bb0(%a: i32, %s: f32, %o: f32):
    %f = arith.sitofp %a : i32 to f32
    %m = arith.mulf %f, %s : f32
    %t = arith.addf %o, %m : f32
    linalg.yield %t : f32
  } -> tensor<1x1x4x1x16xf32>
  %sum = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]} ins(%o1, %o2 : tensor<1x1x4x1x16xf32>, tensor<1x1x4x1x16xf32>) outs(%empty : tensor<1x1x4x1x16xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %t = arith.addf %x, %y : f32
    linalg.yield %t : f32
  } -> tensor<1x1x4x1x16xf32>
  return %sum : tensor<1x1x4x1x16xf32>
}

// -----

// w-chain=2 on gfx936, two waves (128 tokens): one accumulator per wave sums the
// products of both its MMACs (its 64 tokens, K slots (t, r, j)) in int32. In place
// the wave is the group: V is read through a view of its token digits, Wq needs no
// zero spread (every token of the block is the group's), and the f32 partial sums
// stay exact (64 products of at most 128 x 128 each: below 2^24).
// CHECK-LABEL: func.func @chained_waves
// CHECK-SAME: (%[[WQ:.*]]: tensor<1x1x4x1x2x64xi8>, %[[V:.*]]: tensor<1x1x1x128x16xi8>)
// CHECK-NOT: tensor.extract
// CHECK-NOT: arith.select
// CHECK: %[[SUMS:.*]] = linalg.generic {{.*}} ins(%{{.*}}, %{{.*}} : tensor<1x1x1x2x4x64xf32>, tensor<1x1x1x2x64x16xi8>) outs(%{{.*}} : tensor<1x1x4x1x2x16xf32>)
// CHECK:   arith.mulf
// CHECK:   arith.addf
// CHECK: %[[ACC:.*]] = linalg.generic {{.*}} ins(%[[SUMS]] : tensor<1x1x4x1x2x16xf32>) outs(%{{.*}} : tensor<1x1x4x1x2x16xi32>)
// CHECK:   arith.fptosi %{{.*}} : f32 to i32
// CHECK: return %[[ACC]]
// MMT4D-LABEL: func.func @chained_waves
// MMT4D: linalg.batch_mmt4d ins(%{{.*}}, %{{.*}} : tensor<2x1x32x4x2xi16>, tensor<2x1x32x16x2xi16>) outs(%{{.*}} : tensor<2x1x1x4x16xi32>)
// AVX-LABEL: func.func @chained_waves
// AVX: linalg.batch_mmt4d
// SSE-LABEL: func.func @chained_waves
// SSE: linalg.batch_mmt4d
// GATHER-LABEL: func.func @chained_waves
// GATHER: tensor.extract
// GATHER: arith.muli
// GATHER-SAME: i32
#chains = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>,
           array<i64: 64, 65, 66, 67, 68, 69, 70, 71, 80, 81, 82, 83, 84, 85, 86, 87, 96, 97, 98, 99, 100, 101, 102, 103, 112, 113, 114, 115, 116, 117, 118, 119, 72, 73, 74, 75, 76, 77, 78, 79, 88, 89, 90, 91, 92, 93, 94, 95, 104, 105, 106, 107, 108, 109, 110, 111, 120, 121, 122, 123, 124, 125, 126, 127>]
func.func @chained_waves(%wq: tensor<1x1x4x1x2x64xi8>, %v: tensor<1x1x1x128x16xi8>) -> tensor<1x1x4x1x2x16xi32> {
  %acc = "int8attn.mmac_tiles"(%wq, %v) {groups = #chains, fragment_model = "gfx936", chain = 2} : (tensor<1x1x4x1x2x64xi8>, tensor<1x1x1x128x16xi8>) -> tensor<1x1x4x1x2x16xi32>
  return %acc : tensor<1x1x4x1x2x16xi32>
}
