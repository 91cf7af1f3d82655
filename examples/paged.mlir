// Decode over a paged INT8 KV cache (vLLM's layout): 32 query heads over 8 KV
// heads, head dim 128, blocks of 16 tokens. B, NB and MB are dynamic: one
// compiled module serves any batch, pool and mix of context lengths.
//   int8attn run examples/paged.mlir --seed 0
func.func @paged(%q: tensor<?x32x128xf32>, %k_cache: tensor<?x8x16x128xi8>, %k_scale: tensor<?x8x16xf32>, %v_cache: tensor<?x8x128x16xi8>, %v_scale: tensor<?x8x16xf32>, %block_tables: tensor<?x?xi32>, %context_lens: tensor<?xi32>) -> tensor<?x32x128xf32> {
  %o = "int8attn.paged_attention"(%q, %k_cache, %k_scale, %v_cache, %v_scale, %block_tables, %context_lens)
      {block_size = 16 : i64, softmax_scale = 0.0883883 : f32}
      : (tensor<?x32x128xf32>, tensor<?x8x16x128xi8>, tensor<?x8x16xf32>, tensor<?x8x128x16xi8>, tensor<?x8x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x32x128xf32>
  return %o : tensor<?x32x128xf32>
}
