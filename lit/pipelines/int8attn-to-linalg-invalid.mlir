// RUN: not int8attn-opt %s --pipeline int8attn-to-linalg 2>&1 | filecheck %s
// RUN: not int8attn-opt %s -p "int8-qk,no-such-pass" 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not int8attn-opt %s --pipeline "int8attn-to-linalg{pv=int4}" 2>&1 | filecheck %s --check-prefix=OPTION

// Prefill is accepted by the op but not lowered yet: a located error.
// CHECK: int8attn-to-linalg-invalid.mlir:[[# @LINE + 2]]:8: error: 'int8attn.attention' op with mode = "prefill" is not supported by this pipeline yet; only mode = "decode" lowers
func.func @prefill(%q: tensor<1x4x2x16xf32>, %k: tensor<1x4x8x16xi8>, %ks: tensor<1x4x8xf32>, %v: tensor<1x4x8x16xi8>, %vs: tensor<1x4x8xf32>) -> tensor<1x4x2x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "prefill", softmax_scale = 0.25 : f32} : (tensor<1x4x2x16xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>, tensor<1x4x8x16xi8>, tensor<1x4x8xf32>) -> tensor<1x4x2x16xf32>
  return %o : tensor<1x4x2x16xf32>
}

// UNKNOWN: usage: int8attn-opt
// UNKNOWN: error: unknown pass 'no-such-pass' in pipeline. int8attn passes: decode-split-kv, float-pv, fold-v-scale, int8-qk, lower-mmac-tiles, lower-quantize, pv-to-mmac, quantize-w-groups

// OPTION: error: pv must be one of int8, bf16, f32, got 'int4'
