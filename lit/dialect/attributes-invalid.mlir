// RUN: not int8attn-opt %s --split-input-file 2>&1 | filecheck %s

// The int8attn ops carry only their own attributes, no region, an f32
// softmax_scale (an f64 or f16 one would skip the f32 range check) and static
// dims below 2^31; anything else is an error at the op, never ignored.

// -----

// CHECK: attributes-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op has unknown attribute 'causal' (its attributes: 'mode', 'softmax_scale')
func.func @causal(%q: tensor<1x4x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32, causal = true} : (tensor<1x4x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// CHECK: attributes-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op has 1 region(s); int8attn ops have none
func.func @region(%q: tensor<1x4x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) ({
  ^bb0:
  }) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x4x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// CHECK: attributes-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op requires an f32 attribute 'softmax_scale' (e.g. softmax_scale = 0.088 : f32), got 1.000000e+300 : f64
func.func @f64_scale(%q: tensor<1x4x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 1.0e300 : f64} : (tensor<1x4x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// CHECK: attributes-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op requires an f32 attribute 'softmax_scale' (e.g. softmax_scale = 0.088 : f32), got 5.000000e-01 : f16
func.func @f16_scale(%q: tensor<1x4x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.5 : f16} : (tensor<1x4x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// CHECK: attributes-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.paged_attention' op requires an f32 attribute 'softmax_scale' (e.g. softmax_scale = 0.088 : f32), got 1.000000e+300 : f64
func.func @paged_f64_scale(%q: tensor<?x8x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> tensor<?x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 1.0e300 : f64} : (tensor<?x8x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %o : tensor<?x8x64xf32>
}

// -----

// CHECK: attributes-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.paged_attention' op has unknown attribute 'sliding_window' (its attributes: 'block_size', 'softmax_scale')
func.func @paged_extra(%q: tensor<?x8x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> tensor<?x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.125 : f32, sliding_window = 64 : i64} : (tensor<?x8x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %o : tensor<?x8x64xf32>
}

// -----

// CHECK: attributes-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op has unknown attribute 'in_place' (its attributes: 'block_size')
func.func @cache_write_extra(%kn: tensor<?x2x64xf32>, %vn: tensor<?x2x64xf32>, %sm: tensor<?xi32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>) -> tensor<?x2x16x64xi8> {
  %r:4 = "int8attn.cache_write"(%kn, %vn, %sm, %kc, %ks, %vc, %vs) {block_size = 16 : i64, in_place = true} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %r#0 : tensor<?x2x16x64xi8>
}

// -----

// CHECK: attributes-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op k has a dimension of 9223372036854775807; int8attn supports static dimensions below 2^31
func.func @huge(%q: tensor<1x4x16xf32>, %k: tensor<1x4x9223372036854775807x16xi8>, %ks: tensor<1x4x9223372036854775807xf32>, %v: tensor<1x4x9223372036854775807x16xi8>, %vs: tensor<1x4x9223372036854775807xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x4x16xf32>, tensor<1x4x9223372036854775807x16xi8>, tensor<1x4x9223372036854775807xf32>, tensor<1x4x9223372036854775807x16xi8>, tensor<1x4x9223372036854775807xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// -----

// CHECK: attributes-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op k has a dimension of 2147483648; int8attn supports static dimensions below 2^31
func.func @two_to_the_31(%q: tensor<1x4x16xf32>, %k: tensor<1x4x2147483648x16xi8>, %ks: tensor<1x4x2147483648xf32>, %v: tensor<1x4x2147483648x16xi8>, %vs: tensor<1x4x2147483648xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x4x16xf32>, tensor<1x4x2147483648x16xi8>, tensor<1x4x2147483648xf32>, tensor<1x4x2147483648x16xi8>, tensor<1x4x2147483648xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}
