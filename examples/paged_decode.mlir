// A serving decode step on a paged INT8 KV cache (vLLM's layout): 32 query heads
// over 8 KV heads, head dim 128, blocks of 16 tokens. Two public functions on
// one cache, compiled once:
//   @write   int8attn.cache_write: T new tokens' k, v quantized per row and
//            stored at their slots (slot_mapping; a negative slot skips the
//            token), in the caller's cache buffers (lower-cache-write)
//   @attend  int8attn.paged_attention: every sequence over its own length
// T, B, NB and MB are dynamic. examples/paged_decode.py runs a decode loop on it.
func.func @write(%k_new: tensor<?x8x128xf32>, %v_new: tensor<?x8x128xf32>, %slot_mapping: tensor<?xi32>, %k_cache: tensor<?x8x16x128xi8>, %k_scale: tensor<?x8x16xf32>, %v_cache: tensor<?x8x128x16xi8>, %v_scale: tensor<?x8x16xf32>) -> (tensor<?x8x16x128xi8>, tensor<?x8x16xf32>, tensor<?x8x128x16xi8>, tensor<?x8x16xf32>) {
  %c:4 = "int8attn.cache_write"(%k_new, %v_new, %slot_mapping, %k_cache, %k_scale, %v_cache, %v_scale) {block_size = 16 : i64}
      : (tensor<?x8x128xf32>, tensor<?x8x128xf32>, tensor<?xi32>, tensor<?x8x16x128xi8>, tensor<?x8x16xf32>, tensor<?x8x128x16xi8>, tensor<?x8x16xf32>)
      -> (tensor<?x8x16x128xi8>, tensor<?x8x16xf32>, tensor<?x8x128x16xi8>, tensor<?x8x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x8x16x128xi8>, tensor<?x8x16xf32>, tensor<?x8x128x16xi8>, tensor<?x8x16xf32>
}

func.func @attend(%q: tensor<?x32x128xf32>, %k_cache: tensor<?x8x16x128xi8>, %k_scale: tensor<?x8x16xf32>, %v_cache: tensor<?x8x128x16xi8>, %v_scale: tensor<?x8x16xf32>, %block_tables: tensor<?x?xi32>, %context_lens: tensor<?xi32>) -> tensor<?x32x128xf32> {
  %o = "int8attn.paged_attention"(%q, %k_cache, %k_scale, %v_cache, %v_scale, %block_tables, %context_lens)
      {block_size = 16 : i64, softmax_scale = 0.0883883 : f32}
      : (tensor<?x32x128xf32>, tensor<?x8x16x128xi8>, tensor<?x8x16xf32>, tensor<?x8x128x16xi8>, tensor<?x8x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x32x128xf32>
  return %o : tensor<?x32x128xf32>
}
