// RUN: not int8attn-opt %s --split-input-file -p verify-scale-groups 2>&1 | filecheck %s

// Contiguous (wrong) W groups: scales over logical tokens 0-31 / 32-63, values from the
// MMAC's interleaved sets.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 7]]:10: error: W scale of group 0 is computed over tokens {0-31} but the MMAC consuming its quantized values reads tokens {0-7,16-23,32-39,48-55}
// CHECK: note: consumer at {{.*}}verify-scale-groups-invalid.mlir:[[# @LINE + 7]]:8; scales must come from the token set the MMAC really consumes
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
#contiguous = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31>,
               array<i64: 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @contiguous_scales(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups, scale_groups = #contiguous} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %o = "int8attn.grouped_pv"(%q#0, %q#1, %v, %acc) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// Quantized consistently, but V gathered with contiguous groups.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 7]]:8: error: 'int8attn.grouped_pv' op pairs quantized W group 0 (tokens {0-7,16-23,32-39,48-55}) with V tokens {0-31}
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
#contiguous = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31>,
               array<i64: 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @v_gather_mismatch(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %o = "int8attn.grouped_pv"(%q#0, %q#1, %v, %acc) {groups = #contiguous} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// Consistent among themselves, but not what a gfx936 MMAC consumes with
// 16-byte V loads.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 5]]:10: error: 'int8attn.mmac_tiles' op claims MMAC 0 consumes tokens {0-31} but gfx936's fragment model says {0-7,16-23,32-39,48-55}
#contiguous = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31>,
               array<i64: 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @not_the_mmac(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #contiguous} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %acc = "int8attn.mmac_tiles"(%q#0, %v) {groups = #contiguous, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32>
  return %acc : tensor<1x1x4x1x2x16xi32>
}

// -----

// Wq from somewhere the verifier cannot see through.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 4]]:8: error: cannot prove the W scale groups of 'int8attn.grouped_pv': its Wq operand is not produced by 'int8attn.group_quantize'
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @opaque(%wq: tensor<1x1x4x1x2x32xi8>, %sw: tensor<1x1x4x1x2xf32>, %v: tensor<1x1x1x64x16xi8>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %o = "int8attn.grouped_pv"(%wq, %sw, %v, %acc) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// Unsigned W whose offset compensation sums V over logical tokens 0-31 / 32-63
// (the contiguous mistake again, made in the column sums): the MMAC reads the
// interleaved sets.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 8]]:9: error: column sum of group 0 is computed over tokens {0-31} but the MMAC it compensates reads tokens {0-7,16-23,32-39,48-55}
// CHECK: note: consumer at {{.*}}verify-scale-groups-invalid.mlir:[[# @LINE + 8]]:8; the 128 * sum Vq offset must cover the MMAC's own tokens
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
#contiguous = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31>,
               array<i64: 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @contiguous_column_sums(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups, w_quant = "u8"} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %cs = "int8attn.column_sums"(%v) {groups = #contiguous} : (tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x2x16xi32>
  %o = "int8attn.grouped_pv"(%q#0, %q#1, %v, %acc, %cs) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>, tensor<1x1x1x2x16xi32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// The same mistake after pv-to-mmac, on the tiles.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 7]]:9: error: column sum of group 0 is computed over tokens {0-31} but the MMAC it compensates reads tokens {0-7,16-23,32-39,48-55}
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
#half = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31>,
         array<i64: 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @tiles_column_sums(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x2x16xi32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups, w_quant = "u8"} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %cs = "int8attn.column_sums"(%v) {groups = #half} : (tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x2x16xi32>
  %acc = "int8attn.mmac_tiles"(%q#0, %v, %cs) {groups = #groups, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>, tensor<1x1x1x2x16xi32>) -> tensor<1x1x4x1x2x16xi32>
  return %acc : tensor<1x1x4x1x2x16xi32>
}

// -----

// Unsigned W without the offset compensation.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 5]]:8: error: 'int8attn.grouped_pv' op consumes unsigned W (Wq = u - 128) without the column sums that compensate the offset
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @no_column_sums(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups, w_quant = "u8"} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %o = "int8attn.grouped_pv"(%q#0, %q#1, %v, %acc) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// Column sums of another V than the one the MMAC reads.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 5]]:9: error: column sums of another V than the one 'int8attn.grouped_pv' reads
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @other_v(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>, %v2: tensor<1x1x1x64x16xi8>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups, w_quant = "u8"} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %cs = "int8attn.column_sums"(%v2) {groups = #groups} : (tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x2x16xi32>
  %o = "int8attn.grouped_pv"(%q#0, %q#1, %v, %acc, %cs) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>, tensor<1x1x1x2x16xi32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// Signed W with an offset compensation it does not need.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 6]]:8: error: 'int8attn.grouped_pv' op adds 128 * column sums to signed (s8) W; only w_quant = "u8" has an offset
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @signed_with_sums(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %cs = "int8attn.column_sums"(%v) {groups = #groups} : (tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x2x16xi32>
  %o = "int8attn.grouped_pv"(%q#0, %q#1, %v, %acc, %cs) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>, tensor<1x1x1x2x16xi32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// Column sums from somewhere the verifier cannot see through.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 5]]:8: error: cannot prove the column sums of 'int8attn.grouped_pv': they are not produced by 'int8attn.column_sums'
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @opaque_sums(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>, %cs: tensor<1x1x1x2x16xi32>, %acc: tensor<1x1x4x1x16xf32>) -> tensor<1x1x4x1x16xf32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups, w_quant = "u8"} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  %o = "int8attn.grouped_pv"(%q#0, %q#1, %v, %acc, %cs) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>, tensor<1x1x4x1x16xf32>, tensor<1x1x1x2x16xi32>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}

// -----

// A chain of two MMACs into one accumulator whose W scale covers one step's tokens
// (MMAC 0's): the scale is applied once to a sum over both steps.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 5]]:10: error: W scale of group 0 is computed over tokens {0-7,16-23,32-39,48-55}, 32 of the 64 tokens {0-63} whose products one accumulator sums
// CHECK: note: consumer at {{.*}}verify-scale-groups-invalid.mlir:[[# @LINE + 5]]:10; a scale must cover its accumulator's whole token set (every MMAC step of a chain), as it is applied once to the one integer sum
#chain = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
#step = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>]
func.func @one_step_scale(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x1x16xi32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #chain, scale_groups = #step} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x1x64xi8>, tensor<1x1x4x1x1xf32>)
  %acc = "int8attn.mmac_tiles"(%q#0, %v) {groups = #chain, fragment_model = "gfx936", chain = 2} : (tensor<1x1x4x1x1x64xi8>, tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x1x16xi32>
  return %acc : tensor<1x1x4x1x1x16xi32>
}

// -----

// Scales and tiles agree, but the chain joins MMAC 0 of two waves: not two
// consecutive MMACs of gfx936's kernel, whose chain of 2 is one wave.
// CHECK: verify-scale-groups-invalid.mlir:[[# @LINE + 5]]:10: error: 'int8attn.mmac_tiles' op claims the chain of 2 MMACs into accumulator 0 consumes tokens {0-7,16-23,32-39,48-55,64-71,80-87,96-103,112-119} but gfx936 chain 2's fragment model says {0-63}
#wrong = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55, 64, 65, 66, 67, 68, 69, 70, 71, 80, 81, 82, 83, 84, 85, 86, 87, 96, 97, 98, 99, 100, 101, 102, 103, 112, 113, 114, 115, 116, 117, 118, 119>,
          array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63, 72, 73, 74, 75, 76, 77, 78, 79, 88, 89, 90, 91, 92, 93, 94, 95, 104, 105, 106, 107, 108, 109, 110, 111, 120, 121, 122, 123, 124, 125, 126, 127>]
func.func @not_the_chain(%w: tensor<1x1x4x1x128xf32>, %v: tensor<1x1x1x128x16xi8>) -> tensor<1x1x4x1x2x16xi32> {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #wrong} : (tensor<1x1x4x1x128xf32>) -> (tensor<1x1x4x1x2x64xi8>, tensor<1x1x4x1x2xf32>)
  %acc = "int8attn.mmac_tiles"(%q#0, %v) {groups = #wrong, fragment_model = "gfx936", chain = 2} : (tensor<1x1x4x1x2x64xi8>, tensor<1x1x1x128x16xi8>) -> tensor<1x1x4x1x2x16xi32>
  return %acc : tensor<1x1x4x1x2x16xi32>
}
