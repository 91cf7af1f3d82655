// RUN: not int8attn-opt %s --split-input-file 2>&1 | filecheck %s

// Every int8attn op is verified before any pass runs; errors point at the op.

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op query heads (6) must be a multiple of KV heads (4) for GQA
func.func @gqa(%q: tensor<1x6x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x6x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x6x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x6x16xf32>
  return %o : tensor<1x6x16xf32>
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op q has head dim 32 but k has head dim 16
func.func @head_dim(%q: tensor<1x4x32xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x32xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x4x32xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x32xf32>
  return %o : tensor<1x4x32xf32>
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op v has shape [1, 4, 9, 16], expected [1, 4, 8, 16]
func.func @tokens(%q: tensor<1x4x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x9x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x4x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x9x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op k must have element type i8, got tensor<1x4x8x16xf32>
func.func @k_type(%q: tensor<1x4x16xf32>, %k: tensor<1x4x8x16xf32>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x4x16xf32>, tensor<1x4x8x16xf32>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op attribute 'mode' is "append"; expected one of 'decode', 'prefill'
func.func @mode(%q: tensor<1x4x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "append", softmax_scale = 0.25 : f32} : (tensor<1x4x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op requires an f32 attribute 'softmax_scale'
func.func @no_scale(%q: tensor<1x4x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode"} : (tensor<1x4x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op attribute 'softmax_scale' must be positive and finite, got -0.5
func.func @negative_scale(%q: tensor<1x4x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = -0.5 : f32} : (tensor<1x4x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op q must have a static shape, got tensor<?x4x16xf32>
func.func @dynamic(%q: tensor<?x4x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<?x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<?x4x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<?x4x16xf32>
  return %o : tensor<?x4x16xf32>
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.group_quantize' op attribute 'groups' must use each of the 64 tokens of a block exactly once
func.func @groups_overlap(%w: tensor<3x64xf32>) -> (tensor<3x2x32xi8>, tensor<3x2xf32>) {
  %q:2 = "int8attn.group_quantize"(%w) {groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31>, array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31>]} : (tensor<3x64xf32>) -> (tensor<3x2x32xi8>, tensor<3x2xf32>)
  return %q#0, %q#1 : tensor<3x2x32xi8>, tensor<3x2xf32>
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: unknown op 'int8attn.flash'; the int8attn dialect has
func.func @unknown(%x: tensor<4xf32>) -> tensor<4xf32> {
  %o = "int8attn.flash"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %o : tensor<4xf32>
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 1]]:3: error: custom op 'func.retur' is unknown
  func.retur

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: unknown op 'foo.bar': neither an int8attn op nor an op of a dialect IREE's compiler registers
func.func @foreign() -> f32 {
  %0 = "foo.bar"() : () -> f32
  return %0 : f32
}

// -----

// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op k_scale has shape [1, 4, 7], expected [1, 4, 8]
func.func @scale_tokens(%q: tensor<1x4x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x7xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x4x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x7xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// column_sums: i32 [B, Hkv, N, G, D] over a groups table of V's block.
// CHECK: ops-invalid.mlir:[[# @LINE + 4]]:9: error: 'int8attn.column_sums' op result has shape [1, 1, 1, 4, 16], expected [1, 1, 1, 2, 16]
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @column_sums_shape(%v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x4x16xi32> {
  %cs = "int8attn.column_sums"(%v) {groups = #groups} : (tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x4x16xi32>
  return %cs : tensor<1x1x1x4x16xi32>
}

// -----

// A tile's column sums are i32 [B, Hkv, N, G, D].
// CHECK: ops-invalid.mlir:[[# @LINE + 4]]:10: error: 'int8attn.mmac_tiles' op column_sums must have element type i32, got tensor<1x1x1x2x16xi8>
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @tile_sums_type(%wq: tensor<1x1x4x1x2x32xi8>, %v: tensor<1x1x1x64x16xi8>, %cs: tensor<1x1x1x2x16xi8>) -> tensor<1x1x4x1x2x16xi32> {
  %acc = "int8attn.mmac_tiles"(%wq, %v, %cs) {groups = #groups, fragment_model = "gfx936"} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x1x64x16xi8>, tensor<1x1x1x2x16xi8>) -> tensor<1x1x4x1x2x16xi32>
  return %acc : tensor<1x1x4x1x2x16xi32>
}

// -----

// w_quant is s8 or u8.
// CHECK: ops-invalid.mlir:[[# @LINE + 4]]:10: error: 'int8attn.group_quantize' op attribute 'w_quant' is "u4"; expected one of 's8', 'u8'
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @w_quant_value(%w: tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>) {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups, w_quant = "u4"} : (tensor<1x1x4x1x64xf32>) -> (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>)
  return %q#0, %q#1 : tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>
}

// -----

// The PV ops accumulate into their acc operand: it must be the result's type.
// CHECK: ops-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.pv' op acc tensor<1x2x4x2x8xf32> must be the result's type tensor<1x2x4x2x16xf32>
func.func @pv_acc(%p: tensor<1x2x4x2x256xf32>, %v: tensor<1x2x2x256x16xi8>, %vs: tensor<1x2x2x256xf32>, %acc: tensor<1x2x4x2x8xf32>) -> tensor<1x2x4x2x16xf32> {
  %o = "int8attn.pv"(%p, %v, %vs, %acc) : (tensor<1x2x4x2x256xf32>, tensor<1x2x2x256x16xi8>, tensor<1x2x2x256xf32>, tensor<1x2x4x2x8xf32>) -> tensor<1x2x4x2x16xf32>
  return %o : tensor<1x2x4x2x16xf32>
}

// -----

// A grouped_pv without its acc (the form before the PV ops accumulated).
// CHECK: ops-invalid.mlir:[[# @LINE + 4]]:8: error: 'int8attn.grouped_pv' op expects 4 or 5 operands, got 3
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @grouped_without_acc(%wq: tensor<1x1x4x1x2x32xi8>, %sw: tensor<1x1x4x1x2xf32>, %v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x16xf32> {
  %o = "int8attn.grouped_pv"(%wq, %sw, %v) {groups = #groups} : (tensor<1x1x4x1x2x32xi8>, tensor<1x1x4x1x2xf32>, tensor<1x1x1x64x16xi8>) -> tensor<1x1x4x1x16xf32>
  return %o : tensor<1x1x4x1x16xf32>
}
