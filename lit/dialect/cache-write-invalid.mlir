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
