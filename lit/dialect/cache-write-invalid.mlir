// RUN: not int8attn-opt %s --split-input-file 2>&1 | filecheck %s

// int8attn.cache_write: T and NB may be dynamic, nothing else; k_new and v_new
// are [T, Hkv, D] of the caches' Hkv and D, slot_mapping [T] i32, the caches
// agree as paged_attention's do (V token-innermost), 'block_size' is the
// caches' BS, and the results are the four caches' types.

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op v_cache has shape [?, 2, 16, 64], expected [NB, Hkv, D, BS] = [?, 2, 64, 16] (token-innermost blocks)
func.func @v_layout(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x16x64xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op k_new has shape [?, 2, 32], expected [T, Hkv, D] = [?, 2, 64] (the caches' KV heads and head dim)
func.func @head_dim(%a0: tensor<?x2x32xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {block_size = 16 : i64} : (tensor<?x2x32xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op v_new has shape [?, 4, 64], expected [T, Hkv, D] = [?, 2, 64] (the caches' KV heads and head dim)
func.func @kv_heads(%a0: tensor<?x2x64xf32>, %a1: tensor<?x4x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x4x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op k_new, v_new and slot_mapping disagree on the number of new tokens: [4], [?], [3]
func.func @tokens(%a0: tensor<4x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<3xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {block_size = 16 : i64} : (tensor<4x2x64xf32>, tensor<?x2x64xf32>, tensor<3xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op slot_mapping must have element type i32, got tensor<?xi64>
func.func @slot_type(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi64>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi64>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op k_new must have element type f32 or f16 or bf16, got tensor<?x2x64xi8>
func.func @k_type(%a0: tensor<?x2x64xi8>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {block_size = 16 : i64} : (tensor<?x2x64xi8>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op k_cache must have a static shape (only dims 0 may be dynamic), got tensor<?x?x16x64xi8>
func.func @dynamic_heads(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x?x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x?x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x?x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x?x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x?x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op k_scale has shape [?, 2, 32], expected [NB, Hkv, BS] = [?, 2, 16]
func.func @scale_shape(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x32xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x32xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x32xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x32xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x32xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op attribute 'block_size' is 32 but the caches hold blocks of 16 tokens
func.func @block_size(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {block_size = 32 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op requires an integer attribute 'block_size' (the caches' BS, 16)
func.func @no_block_size(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op result #2 has type tensor<4x2x64x16xi8>, expected tensor<?x2x64x16xi8> (the updated v_cache)
func.func @result_type(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<4x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<4x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<4x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op expects 7 or 8 operands, got 6
func.func @arity(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// The optional k_bias is one channel bias per KV head: [Hkv, D] f32.
// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op k_bias has shape [2, 32], expected [Hkv, D] = [2, 64] (one channel bias per KV head)
func.func @bias_shape(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>, %b: tensor<2x32xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6, %b) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<2x32xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op k_bias must have element type f32, got tensor<2x64xf16>
func.func @bias_type(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>, %b: tensor<2x64xf16>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6, %b) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<2x64xf16>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// A cache that is an argument is updated in the caller's array: nothing else may read it.
// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op k_cache is argument #6, which this cache_write updates in place (the caller's array), and 1 more use of it reads it too; give each cache to one cache_write and chain the writes
func.func @two_writes(%k1: tensor<?x2x64xf32>, %v1: tensor<?x2x64xf32>, %s1: tensor<?xi32>, %k2: tensor<?x2x64xf32>, %v2: tensor<?x2x64xf32>, %s2: tensor<?xi32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16x64xi8>) {
  %a:4 = "int8attn.cache_write"(%k1, %v1, %s1, %kc, %ks, %vc, %vs) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  %b:4 = "int8attn.cache_write"(%k2, %v2, %s2, %kc, %ks, %vc, %vs) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %a#0, %b#0 : tensor<?x2x16x64xi8>, tensor<?x2x16x64xi8>
}

// -----

// CHECK: cache-write-invalid.mlir:[[# @LINE + 2]]:10: error: 'int8attn.cache_write' op k_scale is argument #5, which this cache_write updates in place (the caller's array), and 1 more use of it reads it too
func.func @attend_the_old_cache(%kn: tensor<?x2x64xf32>, %vn: tensor<?x2x64xf32>, %s: tensor<?xi32>, %q: tensor<?x8x64xf32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>, %bt: tensor<?x?xi32>, %cl: tensor<?xi32>) -> (tensor<?x2x16x64xi8>, tensor<?x8x64xf32>) {
  %a:4 = "int8attn.cache_write"(%kn, %vn, %s, %kc, %ks, %vc, %vs) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  %o = "int8attn.paged_attention"(%q, %a#0, %ks, %a#2, %a#3, %bt, %cl) {block_size = 16 : i64, softmax_scale = 0.125 : f32} : (tensor<?x8x64xf32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %a#0, %o : tensor<?x2x16x64xi8>, tensor<?x8x64xf32>
}
