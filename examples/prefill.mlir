// Causal prefill with history: 128 new tokens at the end of a 4096-token
// sequence, 32 query heads over 8 KV heads (GQA 4:1), head dim 128.
func.func @prefill(%q: tensor<1x32x128x128xf32>,
                   %k: tensor<1x8x4096x128xi8>, %k_scale: tensor<1x8x4096xf32>,
                   %v: tensor<1x8x4096x128xi8>, %v_scale: tensor<1x8x4096xf32>)
    -> tensor<1x32x128x128xf32> {
  %o = "int8attn.attention"(%q, %k, %k_scale, %v, %v_scale)
      {mode = "prefill", softmax_scale = 0.08838834764831845 : f32}
      : (tensor<1x32x128x128xf32>, tensor<1x8x4096x128xi8>, tensor<1x8x4096xf32>,
         tensor<1x8x4096x128xi8>, tensor<1x8x4096xf32>) -> tensor<1x32x128x128xf32>
  return %o : tensor<1x32x128x128xf32>
}
