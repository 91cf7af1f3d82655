// RUN: not int8attn-opt %s --split-input-file 2>&1 | filecheck %s

// int8attn.paged_attention: B, NB and MB may be dynamic, nothing else; the
// caches agree on Hkv, BS and D, V blocks are token-innermost, the batch of
// q, block_tables and context_lens agrees where it is static.

// CHECK: paged-attention-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.paged_attention' op v_cache has shape [?, 2, 16, 64], expected [NB, Hkv, D, BS] = [?, 2, 64, 16] (token-innermost blocks)
func.func @v_layout(%q: tensor<?x8x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x16x64xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> tensor<?x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.125 : f32} : (tensor<?x8x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %o : tensor<?x8x64xf32>
}

// -----

// CHECK: paged-attention-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.paged_attention' op k_cache must have a static shape (only dims 0 may be dynamic), got tensor<?x?x16x64xi8>
func.func @dynamic_heads(%q: tensor<?x8x64xf32>, %kc: tensor<?x?x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> tensor<?x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.125 : f32} : (tensor<?x8x64xf32>, tensor<?x?x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %o : tensor<?x8x64xf32>
}

// -----

// CHECK: paged-attention-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.paged_attention' op q, block_tables and context_lens disagree on the batch: [2], [3], [?]
func.func @batch(%q: tensor<2x8x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<3x?xi32>, %cl: tensor<?xi32>) -> tensor<2x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.125 : f32} : (tensor<2x8x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<3x?xi32>, tensor<?xi32>) -> tensor<2x8x64xf32>
  return %o : tensor<2x8x64xf32>
}

// -----

// CHECK: paged-attention-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.paged_attention' op attribute 'block_size' is 32 but the caches hold blocks of 16 tokens
func.func @block_size(%q: tensor<?x8x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> tensor<?x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 32 : i64, softmax_scale = 0.125 : f32} : (tensor<?x8x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %o : tensor<?x8x64xf32>
}

// -----

// CHECK: paged-attention-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.paged_attention' op block_tables must have element type i32, got tensor<?x?xi64>
func.func @table_type(%q: tensor<?x8x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi64>, %cl: tensor<?xi32>) -> tensor<?x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.125 : f32} : (tensor<?x8x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<?x?xi64>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %o : tensor<?x8x64xf32>
}

// -----

// CHECK: paged-attention-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.paged_attention' op query heads (6) must be a multiple of KV heads (4) for GQA
func.func @gqa(%q: tensor<?x6x64xf32>, %kc: tensor<?x4x16x64xi8>, %ks: tensor<?x4x16xf32>, %vc: tensor<?x4x64x16xi8>, %vs: tensor<?x4x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> tensor<?x6x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.125 : f32} : (tensor<?x6x64xf32>, tensor<?x4x16x64xi8>, tensor<?x4x16xf32>, tensor<?x4x64x16xi8>, tensor<?x4x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x6x64xf32>
  return %o : tensor<?x6x64xf32>
}

// -----

// CHECK: paged-attention-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.paged_attention' op attribute 'softmax_scale' must be positive and finite, got -1.0
func.func @scale(%q: tensor<?x8x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> tensor<?x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = -1.0 : f32} : (tensor<?x8x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %o : tensor<?x8x64xf32>
}

// -----

// A chunked prefill (q [B, Hq, Sq, D]) returns [B, Hq, Sq, D].
// CHECK: paged-attention-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.paged_attention' op result must have rank 4, got tensor<?x8x64xf32>
func.func @chunk_result(%q: tensor<?x8x5x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> tensor<?x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %kc, %ks, %vc, %vs, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.125 : f32} : (tensor<?x8x5x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %o : tensor<?x8x64xf32>
}
