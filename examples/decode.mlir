// Decode attention over an INT8 KV cache: 32 query heads share 8 KV heads
// (GQA 4:1), head dim 128, 4096 cached tokens, softmax scale 1/sqrt(128).
func.func @decode(%q: tensor<1x32x128xf32>,
                  %k: tensor<1x8x4096x128xi8>, %k_scale: tensor<1x8x4096xf32>,
                  %v: tensor<1x8x4096x128xi8>, %v_scale: tensor<1x8x4096xf32>)
    -> tensor<1x32x128xf32> {
  %o = "int8attn.attention"(%q, %k, %k_scale, %v, %v_scale)
      {mode = "decode", softmax_scale = 0.08838834764831845 : f32}
      : (tensor<1x32x128xf32>, tensor<1x8x4096x128xi8>, tensor<1x8x4096xf32>,
         tensor<1x8x4096x128xi8>, tensor<1x8x4096xf32>) -> tensor<1x32x128xf32>
  return %o : tensor<1x32x128xf32>
}
