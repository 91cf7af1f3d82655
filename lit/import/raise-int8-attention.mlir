// RUN: int8attn-opt %s --split-input-file -p raise-int8-attention 2>/dev/null | filecheck %s
// RUN: int8attn-opt %s --split-input-file -p raise-int8-attention 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK

// Each function is iree-import-onnx's output for one form of
// int8attn.reference.onnx_attention.attention_model(name): the same attention
// over a dequantized cache (Hkv=2, S=8, D=16), as exporters write it. The
// raisable ones are raised; the others are left for IREE, with a remark saying why.

// Decode, GQA 2:1 by Unsqueeze/Expand/Reshape, scales [B,Hkv,S] unsqueezed, scores * 1/sqrt(D).
// CHECK-LABEL: func.func @decode_gqa
// CHECK-SAME: (%[[Q:.*]]: !torch.vtensor<[1,4,1,16],f32>, %[[K:.*]]: !torch.vtensor<[1,2,8,16],si8>, %[[KS:.*]]: !torch.vtensor<[1,2,8],f32>, %[[V:.*]]: !torch.vtensor<[1,2,8,16],si8>, %[[VS:.*]]: !torch.vtensor<[1,2,8],f32>)
// CHECK-NOT: torch.operator
// CHECK: %[[QB:.*]] = torch_c.to_builtin_tensor %[[Q]] : !torch.vtensor<[1,4,1,16],f32> -> tensor<1x4x1x16xf32>
// CHECK: %[[Q3:.*]] = tensor.collapse_shape %[[QB]] {{\[\[}}0], [1], [2, 3]] : tensor<1x4x1x16xf32> into tensor<1x4x16xf32>
// CHECK: %[[KB:.*]] = torch_c.to_builtin_tensor %[[K]] : !torch.vtensor<[1,2,8,16],si8> -> tensor<1x2x8x16xi8>
// CHECK: %[[KSB:.*]] = torch_c.to_builtin_tensor %[[KS]]
// CHECK: %[[VB:.*]] = torch_c.to_builtin_tensor %[[V]]
// CHECK: %[[VSB:.*]] = torch_c.to_builtin_tensor %[[VS]]
// CHECK: %[[O:.*]] = "int8attn.attention"(%[[Q3]], %[[KB]], %[[KSB]], %[[VB]], %[[VSB]]) {mode = "decode", softmax_scale = 2.500000e-01 : f32} : (tensor<1x4x16xf32>, tensor<1x2x8x16xi8>, tensor<1x2x8xf32>, tensor<1x2x8x16xi8>, tensor<1x2x8xf32>) -> tensor<1x4x16xf32>
// CHECK: %[[O4:.*]] = tensor.expand_shape %[[O]] {{\[\[}}0], [1], [2, 3]] output_shape [1, 4, 1, 16]
// CHECK: %[[R:.*]] = torch_c.from_builtin_tensor %[[O4]] : tensor<1x4x1x16xf32> -> !torch.vtensor<[1,4,1,16],f32>
// CHECK-NOT: torch.operator
// CHECK: return %[[R]]
// REMARK: raise-int8-attention.mlir:[[# @LINE + 28]]:11: remark: [Passed] raise-int8-attention: raised to int8attn.attention (decode, 4 query heads over 2 KV heads, 8 tokens, head dim 16, softmax_scale 0.25)
module {
  func.func @decode_gqa(%arg0: !torch.vtensor<[1,4,1,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,4,1,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %1 = torch.operator "onnx.Unsqueeze"(%arg2, %0) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %2 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %3 = torch.operator "onnx.Mul"(%2, %1) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %5 = torch.operator "onnx.Unsqueeze"(%3, %4) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %6 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %7 = torch.operator "onnx.Expand"(%5, %6) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %8 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %9 = torch.operator "onnx.Reshape"(%7, %8) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %11 = torch.operator "onnx.Unsqueeze"(%arg4, %10) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %12 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %13 = torch.operator "onnx.Mul"(%12, %11) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %14 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %15 = torch.operator "onnx.Unsqueeze"(%13, %14) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %16 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %17 = torch.operator "onnx.Expand"(%15, %16) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %18 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %19 = torch.operator "onnx.Reshape"(%17, %18) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %20 = torch.operator "onnx.Transpose"(%9) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,16,8],f32>
    %21 = torch.operator "onnx.MatMul"(%arg0, %20) : (!torch.vtensor<[1,4,1,16],f32>, !torch.vtensor<[1,4,16,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %22 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2.500000e-01> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %23 = torch.operator "onnx.Mul"(%21, %22) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %24 = torch.operator "onnx.Softmax"(%23) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,4,1,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %25 = torch.operator "onnx.MatMul"(%24, %19) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,1,16],f32>
    return %25 : !torch.vtensor<[1,4,1,16],f32>
  }
}

// -----

// Prefill (4 of 8 tokens), no GQA, an additive causal mask (0 / -inf), scores / sqrt(D).
// CHECK-LABEL: func.func @prefill_add
// CHECK-NOT: collapse_shape
// CHECK: "int8attn.attention"({{.*}}) {mode = "prefill", softmax_scale = 2.500000e-01 : f32} : (tensor<1x2x4x16xf32>, tensor<1x2x8x16xi8>, tensor<1x2x8xf32>, tensor<1x2x8x16xi8>, tensor<1x2x8xf32>) -> tensor<1x2x4x16xf32>
// CHECK-NOT: torch.operator
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 18]]:11: remark: [Passed] raise-int8-attention: raised to int8attn.attention (prefill, 2 query heads over 2 KV heads, 4 query tokens of 8, head dim 16, softmax_scale 0.25)
module {
  func.func @prefill_add(%arg0: !torch.vtensor<[1,2,4,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,2,4,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %1 = torch.operator "onnx.Unsqueeze"(%arg2, %0) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %2 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %3 = torch.operator "onnx.Mul"(%2, %1) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %5 = torch.operator "onnx.Unsqueeze"(%arg4, %4) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %6 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %7 = torch.operator "onnx.Mul"(%6, %5) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %8 = torch.operator "onnx.Transpose"(%3) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,2,8,16],f32>) -> !torch.vtensor<[1,2,16,8],f32>
    %9 = torch.operator "onnx.MatMul"(%arg0, %8) : (!torch.vtensor<[1,2,4,16],f32>, !torch.vtensor<[1,2,16,8],f32>) -> !torch.vtensor<[1,2,4,8],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<4.000000e+00> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %11 = torch.operator "onnx.Div"(%9, %10) : (!torch.vtensor<[1,2,4,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,2,4,8],f32>
    %12 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[[[[0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0xFF800000, 0xFF800000, 0xFF800000], [0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0xFF800000, 0xFF800000], [0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0xFF800000], [0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00]]]]> : tensor<1x1x4x8xf32>} : () -> !torch.vtensor<[1,1,4,8],f32>
    %13 = torch.operator "onnx.Add"(%11, %12) : (!torch.vtensor<[1,2,4,8],f32>, !torch.vtensor<[1,1,4,8],f32>) -> !torch.vtensor<[1,2,4,8],f32>
    %14 = torch.operator "onnx.Softmax"(%13) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,2,4,8],f32>) -> !torch.vtensor<[1,2,4,8],f32>
    %15 = torch.operator "onnx.MatMul"(%14, %7) : (!torch.vtensor<[1,2,4,8],f32>, !torch.vtensor<[1,2,8,16],f32>) -> !torch.vtensor<[1,2,4,16],f32>
    return %15 : !torch.vtensor<[1,2,4,16],f32>
  }
}

// -----

// Prefill, a Where mask (keep / -3.4e38), q scaled before the MatMul, scales given as [B,Hkv,S,1].
// CHECK-LABEL: func.func @prefill_where
// CHECK: %[[KS:.*]] = torch_c.to_builtin_tensor %arg2 : !torch.vtensor<[1,2,8,1],f32> -> tensor<1x2x8x1xf32>
// CHECK: %[[KS3:.*]] = tensor.collapse_shape %[[KS]] {{\[\[}}0], [1], [2, 3]] : tensor<1x2x8x1xf32> into tensor<1x2x8xf32>
// CHECK: "int8attn.attention"({{.*}}, {{.*}}, %[[KS3]], {{.*}}) {mode = "prefill", softmax_scale = 2.500000e-01 : f32}
// CHECK-NOT: torch.operator
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 27]]:11: remark: [Passed] raise-int8-attention: raised to int8attn.attention (prefill, 4 query heads over 2 KV heads, 4 query tokens of 8, head dim 16, softmax_scale 0.25)
module {
  func.func @prefill_where(%arg0: !torch.vtensor<[1,4,4,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8,1],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,4,4,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %1 = torch.operator "onnx.Mul"(%0, %arg2) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %2 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %3 = torch.operator "onnx.Unsqueeze"(%1, %2) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %5 = torch.operator "onnx.Expand"(%3, %4) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %6 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %7 = torch.operator "onnx.Reshape"(%5, %6) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %8 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %9 = torch.operator "onnx.Mul"(%8, %arg4) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %11 = torch.operator "onnx.Unsqueeze"(%9, %10) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %12 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %13 = torch.operator "onnx.Expand"(%11, %12) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %14 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %15 = torch.operator "onnx.Reshape"(%13, %14) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %16 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2.500000e-01> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %17 = torch.operator "onnx.Mul"(%arg0, %16) : (!torch.vtensor<[1,4,4,16],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,4,16],f32>
    %18 = torch.operator "onnx.Transpose"(%7) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,16,8],f32>
    %19 = torch.operator "onnx.MatMul"(%17, %18) : (!torch.vtensor<[1,4,4,16],f32>, !torch.vtensor<[1,4,16,8],f32>) -> !torch.vtensor<[1,4,4,8],f32>
    %20 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[[[[true, true, true, true, true, false, false, false], [true, true, true, true, true, true, false, false], [true, true, true, true, true, true, true, false], [true, true, true, true, true, true, true, true]]]]> : tensor<1x1x4x8xi1>} : () -> !torch.vtensor<[1,1,4,8],i1>
    %21 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<-3.400000e+38> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %22 = torch.operator "onnx.Where"(%20, %19, %21) : (!torch.vtensor<[1,1,4,8],i1>, !torch.vtensor<[1,4,4,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,4,8],f32>
    %23 = torch.operator "onnx.Softmax"(%22) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,4,4,8],f32>) -> !torch.vtensor<[1,4,4,8],f32>
    %24 = torch.operator "onnx.MatMul"(%23, %15) : (!torch.vtensor<[1,4,4,8],f32>, !torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,4,16],f32>
    return %24 : !torch.vtensor<[1,4,4,16],f32>
  }
}

// -----

// A scale per channel ([1,Hkv,1,D]): the PV fold needs one per token.
// CHECK-LABEL: func.func @per_channel
// CHECK: torch.operator "onnx.Softmax"
// CHECK-NOT: int8attn.attention
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 24]]:11: remark: [Missed] raise-int8-attention: not raised: K's scale [1, 2, 1, 16] varies along the head dim (per channel), not per token; IREE compiles this attention in float
module {
  func.func @per_channel(%arg0: !torch.vtensor<[1,4,1,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,1,16],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,1,16],f32>) -> !torch.vtensor<[1,4,1,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %1 = torch.operator "onnx.Mul"(%0, %arg2) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,1,16],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %2 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %3 = torch.operator "onnx.Unsqueeze"(%1, %2) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %5 = torch.operator "onnx.Expand"(%3, %4) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %6 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %7 = torch.operator "onnx.Reshape"(%5, %6) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %8 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %9 = torch.operator "onnx.Mul"(%8, %arg4) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,1,16],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %11 = torch.operator "onnx.Unsqueeze"(%9, %10) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %12 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %13 = torch.operator "onnx.Expand"(%11, %12) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %14 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %15 = torch.operator "onnx.Reshape"(%13, %14) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %16 = torch.operator "onnx.Transpose"(%7) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,16,8],f32>
    %17 = torch.operator "onnx.MatMul"(%arg0, %16) : (!torch.vtensor<[1,4,1,16],f32>, !torch.vtensor<[1,4,16,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %18 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2.500000e-01> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %19 = torch.operator "onnx.Mul"(%17, %18) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %20 = torch.operator "onnx.Softmax"(%19) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,4,1,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %21 = torch.operator "onnx.MatMul"(%20, %15) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,1,16],f32>
    return %21 : !torch.vtensor<[1,4,1,16],f32>
  }
}

// -----

// One scale for the whole cache.
// CHECK-LABEL: func.func @per_tensor
// CHECK: torch.operator "onnx.Softmax"
// CHECK-NOT: int8attn.attention
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 24]]:11: remark: [Missed] raise-int8-attention: not raised: K has one scale for the whole tensor (per tensor), not one per token
module {
  func.func @per_tensor(%arg0: !torch.vtensor<[1,4,1,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,1,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %1 = torch.operator "onnx.Mul"(%0, %arg2) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %2 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %3 = torch.operator "onnx.Unsqueeze"(%1, %2) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %5 = torch.operator "onnx.Expand"(%3, %4) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %6 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %7 = torch.operator "onnx.Reshape"(%5, %6) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %8 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %9 = torch.operator "onnx.Mul"(%8, %arg4) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %11 = torch.operator "onnx.Unsqueeze"(%9, %10) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %12 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %13 = torch.operator "onnx.Expand"(%11, %12) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %14 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %15 = torch.operator "onnx.Reshape"(%13, %14) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %16 = torch.operator "onnx.Transpose"(%7) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,16,8],f32>
    %17 = torch.operator "onnx.MatMul"(%arg0, %16) : (!torch.vtensor<[1,4,1,16],f32>, !torch.vtensor<[1,4,16,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %18 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2.500000e-01> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %19 = torch.operator "onnx.Mul"(%17, %18) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %20 = torch.operator "onnx.Softmax"(%19) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,4,1,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %21 = torch.operator "onnx.MatMul"(%20, %15) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,1,16],f32>
    return %21 : !torch.vtensor<[1,4,1,16],f32>
  }
}

// -----

// A mask that hides tokens 0-1 from every query: not int8attn's causal prefill.
// CHECK-LABEL: func.func @not_causal
// CHECK: torch.operator "onnx.Softmax"
// CHECK-NOT: int8attn.attention
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 30]]:11: remark: [Missed] raise-int8-attention: not raised: the mask is not causal: query token 0 (position 4) does not see token 0
module {
  func.func @not_causal(%arg0: !torch.vtensor<[1,4,4,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,4,4,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %1 = torch.operator "onnx.Unsqueeze"(%arg2, %0) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %2 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %3 = torch.operator "onnx.Mul"(%2, %1) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %5 = torch.operator "onnx.Unsqueeze"(%3, %4) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %6 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %7 = torch.operator "onnx.Expand"(%5, %6) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %8 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %9 = torch.operator "onnx.Reshape"(%7, %8) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %11 = torch.operator "onnx.Unsqueeze"(%arg4, %10) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %12 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %13 = torch.operator "onnx.Mul"(%12, %11) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %14 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %15 = torch.operator "onnx.Unsqueeze"(%13, %14) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %16 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %17 = torch.operator "onnx.Expand"(%15, %16) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %18 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %19 = torch.operator "onnx.Reshape"(%17, %18) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %20 = torch.operator "onnx.Transpose"(%9) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,16,8],f32>
    %21 = torch.operator "onnx.MatMul"(%arg0, %20) : (!torch.vtensor<[1,4,4,16],f32>, !torch.vtensor<[1,4,16,8],f32>) -> !torch.vtensor<[1,4,4,8],f32>
    %22 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2.500000e-01> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %23 = torch.operator "onnx.Mul"(%21, %22) : (!torch.vtensor<[1,4,4,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,4,8],f32>
    %24 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[[[[0xFF800000, 0xFF800000, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0xFF800000, 0xFF800000, 0xFF800000], [0xFF800000, 0xFF800000, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0xFF800000, 0xFF800000], [0xFF800000, 0xFF800000, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0xFF800000], [0xFF800000, 0xFF800000, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00]]]]> : tensor<1x1x4x8xf32>} : () -> !torch.vtensor<[1,1,4,8],f32>
    %25 = torch.operator "onnx.Add"(%23, %24) : (!torch.vtensor<[1,4,4,8],f32>, !torch.vtensor<[1,1,4,8],f32>) -> !torch.vtensor<[1,4,4,8],f32>
    %26 = torch.operator "onnx.Softmax"(%25) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,4,4,8],f32>) -> !torch.vtensor<[1,4,4,8],f32>
    %27 = torch.operator "onnx.MatMul"(%26, %19) : (!torch.vtensor<[1,4,4,8],f32>, !torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,4,16],f32>
    return %27 : !torch.vtensor<[1,4,4,16],f32>
  }
}

// -----

// Four query tokens and no mask: bidirectional attention.
// CHECK-LABEL: func.func @no_mask
// CHECK: torch.operator "onnx.Softmax"
// CHECK-NOT: int8attn.attention
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 28]]:11: remark: [Missed] raise-int8-attention: not raised: 4 query tokens attend without a mask (bidirectional); int8attn's prefill is causal
module {
  func.func @no_mask(%arg0: !torch.vtensor<[1,4,4,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,4,4,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %1 = torch.operator "onnx.Unsqueeze"(%arg2, %0) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %2 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %3 = torch.operator "onnx.Mul"(%2, %1) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %5 = torch.operator "onnx.Unsqueeze"(%3, %4) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %6 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %7 = torch.operator "onnx.Expand"(%5, %6) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %8 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %9 = torch.operator "onnx.Reshape"(%7, %8) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %11 = torch.operator "onnx.Unsqueeze"(%arg4, %10) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %12 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %13 = torch.operator "onnx.Mul"(%12, %11) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %14 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %15 = torch.operator "onnx.Unsqueeze"(%13, %14) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %16 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %17 = torch.operator "onnx.Expand"(%15, %16) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %18 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %19 = torch.operator "onnx.Reshape"(%17, %18) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %20 = torch.operator "onnx.Transpose"(%9) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,16,8],f32>
    %21 = torch.operator "onnx.MatMul"(%arg0, %20) : (!torch.vtensor<[1,4,4,16],f32>, !torch.vtensor<[1,4,16,8],f32>) -> !torch.vtensor<[1,4,4,8],f32>
    %22 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2.500000e-01> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %23 = torch.operator "onnx.Mul"(%21, %22) : (!torch.vtensor<[1,4,4,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,4,8],f32>
    %24 = torch.operator "onnx.Softmax"(%23) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,4,4,8],f32>) -> !torch.vtensor<[1,4,4,8],f32>
    %25 = torch.operator "onnx.MatMul"(%24, %19) : (!torch.vtensor<[1,4,4,8],f32>, !torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,4,16],f32>
    return %25 : !torch.vtensor<[1,4,4,16],f32>
  }
}

// -----

// KV heads repeated by Tile: query head h reads KV head h mod Hkv, not h // 2.
// CHECK-LABEL: func.func @tile
// CHECK: torch.operator "onnx.Softmax"
// CHECK-NOT: int8attn.attention
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 20]]:11: remark: [Missed] raise-int8-attention: not raised: K's KV heads are repeated with Tile: query head h reads KV head h mod Hkv, int8attn's GQA reads KV head h // (Hq/Hkv)
module {
  func.func @tile(%arg0: !torch.vtensor<[1,4,1,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,4,1,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %1 = torch.operator "onnx.Unsqueeze"(%arg2, %0) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %2 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %3 = torch.operator "onnx.Mul"(%2, %1) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 1, 1]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %5 = torch.operator "onnx.Tile"(%3, %4) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %6 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %7 = torch.operator "onnx.Unsqueeze"(%arg4, %6) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %8 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %9 = torch.operator "onnx.Mul"(%8, %7) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 1, 1]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %11 = torch.operator "onnx.Tile"(%9, %10) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %12 = torch.operator "onnx.Transpose"(%5) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,16,8],f32>
    %13 = torch.operator "onnx.MatMul"(%arg0, %12) : (!torch.vtensor<[1,4,1,16],f32>, !torch.vtensor<[1,4,16,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %14 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2.500000e-01> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %15 = torch.operator "onnx.Mul"(%13, %14) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %16 = torch.operator "onnx.Softmax"(%15) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,4,1,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %17 = torch.operator "onnx.MatMul"(%16, %11) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,1,16],f32>
    return %17 : !torch.vtensor<[1,4,1,16],f32>
  }
}

// -----

// K is a float cache (an f32 argument), not int8.
// CHECK-LABEL: func.func @float_cache
// CHECK: torch.operator "onnx.Softmax"
// CHECK-NOT: int8attn.attention
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 24]]:11: remark: [Missed] raise-int8-attention: not raised: K is not dequantized from int8 (Cast(int8) × a scale per token): it comes from a function argument
module {
  func.func @float_cache(%arg0: !torch.vtensor<[1,4,1,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],f32>, %arg2: !torch.vtensor<[1,2,8,16],si8>, %arg3: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,4,1,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %1 = torch.operator "onnx.Unsqueeze"(%arg1, %0) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %2 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %3 = torch.operator "onnx.Expand"(%1, %2) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %5 = torch.operator "onnx.Reshape"(%3, %4) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %6 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %7 = torch.operator "onnx.Unsqueeze"(%arg3, %6) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %8 = torch.operator "onnx.Cast"(%arg2) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %9 = torch.operator "onnx.Mul"(%8, %7) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %11 = torch.operator "onnx.Unsqueeze"(%9, %10) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %12 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %13 = torch.operator "onnx.Expand"(%11, %12) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %14 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %15 = torch.operator "onnx.Reshape"(%13, %14) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %16 = torch.operator "onnx.Transpose"(%5) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,16,8],f32>
    %17 = torch.operator "onnx.MatMul"(%arg0, %16) : (!torch.vtensor<[1,4,1,16],f32>, !torch.vtensor<[1,4,16,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %18 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2.500000e-01> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %19 = torch.operator "onnx.Mul"(%17, %18) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %20 = torch.operator "onnx.Softmax"(%19) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,4,1,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %21 = torch.operator "onnx.MatMul"(%20, %15) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,1,16],f32>
    return %21 : !torch.vtensor<[1,4,1,16],f32>
  }
}

// -----

// An additive bias (0.5 everywhere), not a mask.
// CHECK-LABEL: func.func @bias
// CHECK: torch.operator "onnx.Softmax"
// CHECK-NOT: int8attn.attention
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 30]]:11: remark: [Missed] raise-int8-attention: not raised: the scores get an added constant with values other than 0 and <= -1e+09 (a bias, not a mask)
module {
  func.func @bias(%arg0: !torch.vtensor<[1,4,1,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,4,1,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %1 = torch.operator "onnx.Unsqueeze"(%arg2, %0) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %2 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %3 = torch.operator "onnx.Mul"(%2, %1) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %5 = torch.operator "onnx.Unsqueeze"(%3, %4) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %6 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %7 = torch.operator "onnx.Expand"(%5, %6) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %8 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %9 = torch.operator "onnx.Reshape"(%7, %8) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %11 = torch.operator "onnx.Unsqueeze"(%arg4, %10) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %12 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %13 = torch.operator "onnx.Mul"(%12, %11) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %14 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %15 = torch.operator "onnx.Unsqueeze"(%13, %14) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,1,8,16],f32>
    %16 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %17 = torch.operator "onnx.Expand"(%15, %16) : (!torch.vtensor<[1,2,1,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %18 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %19 = torch.operator "onnx.Reshape"(%17, %18) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %20 = torch.operator "onnx.Transpose"(%9) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,16,8],f32>
    %21 = torch.operator "onnx.MatMul"(%arg0, %20) : (!torch.vtensor<[1,4,1,16],f32>, !torch.vtensor<[1,4,16,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %22 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2.500000e-01> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %23 = torch.operator "onnx.Mul"(%21, %22) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %24 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<5.000000e-01> : tensor<1x1x1x8xf32>} : () -> !torch.vtensor<[1,1,1,8],f32>
    %25 = torch.operator "onnx.Add"(%23, %24) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[1,1,1,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %26 = torch.operator "onnx.Softmax"(%25) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,4,1,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %27 = torch.operator "onnx.MatMul"(%26, %19) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,1,16],f32>
    return %27 : !torch.vtensor<[1,4,1,16],f32>
  }
}

// -----

// ONNX's Attention op (opset 23), decode, GQA its own: IREE 3.13 has no lowering for it.
// CHECK-LABEL: func.func @attention_op
// CHECK-NOT: torch.operator
// CHECK: "int8attn.attention"({{.*}}) {mode = "decode", softmax_scale = 2.500000e-01 : f32} : (tensor<1x4x16xf32>, tensor<1x2x8x16xi8>, tensor<1x2x8xf32>, tensor<1x2x8x16xi8>, tensor<1x2x8xf32>) -> tensor<1x4x16xf32>
// CHECK-NOT: torch.operator
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 12]]:10: remark: [Passed] raise-int8-attention: raised to int8attn.attention (decode, 4 query heads over 2 KV heads, 8 tokens, head dim 16, softmax_scale 0.25)
module {
  func.func @attention_op(%arg0: !torch.vtensor<[1,4,1,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,4,1,16],f32> attributes {torch.onnx_meta.ir_version = 10 : si64, torch.onnx_meta.opset_version = 23 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %1 = torch.operator "onnx.Unsqueeze"(%arg2, %0) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %2 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %3 = torch.operator "onnx.Mul"(%2, %1) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %5 = torch.operator "onnx.Unsqueeze"(%arg4, %4) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %6 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %7 = torch.operator "onnx.Mul"(%6, %5) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %8 = torch.operator "onnx.Attention"(%arg0, %3, %7) {torch.onnx.is_causal = 0 : si64} : (!torch.vtensor<[1,4,1,16],f32>, !torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,16],f32>) -> !torch.vtensor<[1,4,1,16],f32>
    return %8 : !torch.vtensor<[1,4,1,16],f32>
  }
}

// -----

// The Attention op with a boolean attn_mask that is int8attn's causal one.
// CHECK-LABEL: func.func @attention_op_prefill
// CHECK: "int8attn.attention"({{.*}}) {mode = "prefill", softmax_scale = 2.500000e-01 : f32}
// CHECK-NOT: torch.operator
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 13]]:10: remark: [Passed] raise-int8-attention: raised to int8attn.attention (prefill, 4 query heads over 2 KV heads, 4 query tokens of 8, head dim 16, softmax_scale 0.25)
module {
  func.func @attention_op_prefill(%arg0: !torch.vtensor<[1,4,4,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,4,4,16],f32> attributes {torch.onnx_meta.ir_version = 10 : si64, torch.onnx_meta.opset_version = 23 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[[[[true, true, true, true, true, false, false, false], [true, true, true, true, true, true, false, false], [true, true, true, true, true, true, true, false], [true, true, true, true, true, true, true, true]]]]> : tensor<1x1x4x8xi1>} : () -> !torch.vtensor<[1,1,4,8],i1>
    %1 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %2 = torch.operator "onnx.Unsqueeze"(%arg2, %1) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %3 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %4 = torch.operator "onnx.Mul"(%3, %2) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %5 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %6 = torch.operator "onnx.Unsqueeze"(%arg4, %5) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %7 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %8 = torch.operator "onnx.Mul"(%7, %6) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %9 = torch.operator "onnx.Attention"(%arg0, %4, %8, %0) {torch.onnx.is_causal = 0 : si64} : (!torch.vtensor<[1,4,4,16],f32>, !torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,1,4,8],i1>) -> !torch.vtensor<[1,4,4,16],f32>
    return %9 : !torch.vtensor<[1,4,4,16],f32>
  }
}

// -----

// is_causal=1 over a longer cache: ONNX aligns it upper left.
// CHECK-LABEL: func.func @attention_op_causal
// CHECK: torch.operator "onnx.Attention"
// CHECK-NOT: int8attn.attention
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 12]]:10: remark: [Missed] raise-int8-attention: not raised: is_causal with 4 query tokens over 8 keys: ONNX aligns that mask upper left (query i sees keys <= i), int8attn's prefill bottom right (keys <= S - Sq + i)
module {
  func.func @attention_op_causal(%arg0: !torch.vtensor<[1,4,4,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,4,4,16],f32> attributes {torch.onnx_meta.ir_version = 10 : si64, torch.onnx_meta.opset_version = 23 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %1 = torch.operator "onnx.Unsqueeze"(%arg2, %0) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %2 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %3 = torch.operator "onnx.Mul"(%2, %1) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %5 = torch.operator "onnx.Unsqueeze"(%arg4, %4) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %6 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %7 = torch.operator "onnx.Mul"(%6, %5) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %8 = torch.operator "onnx.Attention"(%arg0, %3, %7) {torch.onnx.is_causal = 1 : si64} : (!torch.vtensor<[1,4,4,16],f32>, !torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,16],f32>) -> !torch.vtensor<[1,4,4,16],f32>
    return %8 : !torch.vtensor<[1,4,4,16],f32>
  }
}

// -----

// A graph without attention: nothing to raise, said once for the function.
// CHECK-LABEL: func.func @no_attention
// CHECK: torch.operator "onnx.Add"
// REMARK: raise-int8-attention.mlir:[[# @LINE + 2]]:3: remark: [Missed] raise-int8-attention: no attention (no onnx.Softmax or onnx.Attention) in @no_attention; IREE compiles the whole graph
module {
  func.func @no_attention(%arg0: !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Add"(%arg0, %arg0) : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>
    return %0 : !torch.vtensor<[2,3],f32>
  }
}

// -----

// KV heads repeated on axis 1 (Unsqueeze 1 / Expand [B,g,Hkv,..] / Reshape): query head h
// reads KV head h mod Hkv. The Expand's result has the same shape as the raisable form's
// ([1,2,2,8,16] with g = Hkv = 2): only where the unit axis was inserted tells them apart.
// CHECK-LABEL: func.func @heads_outer
// CHECK: torch.operator "onnx.Softmax"
// CHECK-NOT: int8attn.attention
// CHECK: return
// REMARK: raise-int8-attention.mlir:[[# @LINE + 28]]:11: remark: [Missed] raise-int8-attention: not raised: K's Expand does not repeat each KV head next to itself (a unit axis 2); IREE compiles this attention in float
module {
  func.func @heads_outer(%arg0: !torch.vtensor<[1,4,1,16],f32>, %arg1: !torch.vtensor<[1,2,8,16],si8>, %arg2: !torch.vtensor<[1,2,8],f32>, %arg3: !torch.vtensor<[1,2,8,16],si8>, %arg4: !torch.vtensor<[1,2,8],f32>) -> !torch.vtensor<[1,4,1,16],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 18 : si64, torch.onnx_meta.producer_name = "", torch.onnx_meta.producer_version = ""} {
    %none = torch.constant.none
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %1 = torch.operator "onnx.Unsqueeze"(%arg2, %0) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %2 = torch.operator "onnx.Cast"(%arg1) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %3 = torch.operator "onnx.Mul"(%2, %1) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %4 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<1> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %5 = torch.operator "onnx.Unsqueeze"(%3, %4) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,1,2,8,16],f32>
    %6 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %7 = torch.operator "onnx.Expand"(%5, %6) : (!torch.vtensor<[1,1,2,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %8 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %9 = torch.operator "onnx.Reshape"(%7, %8) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %10 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<3> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %11 = torch.operator "onnx.Unsqueeze"(%arg4, %10) : (!torch.vtensor<[1,2,8],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,2,8,1],f32>
    %12 = torch.operator "onnx.Cast"(%arg3) {torch.onnx.to = 1 : si64} : (!torch.vtensor<[1,2,8,16],si8>) -> !torch.vtensor<[1,2,8,16],f32>
    %13 = torch.operator "onnx.Mul"(%12, %11) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1,2,8,1],f32>) -> !torch.vtensor<[1,2,8,16],f32>
    %14 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<1> : tensor<1xsi64>} : () -> !torch.vtensor<[1],si64>
    %15 = torch.operator "onnx.Unsqueeze"(%13, %14) : (!torch.vtensor<[1,2,8,16],f32>, !torch.vtensor<[1],si64>) -> !torch.vtensor<[1,1,2,8,16],f32>
    %16 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 2, 2, 8, 16]> : tensor<5xsi64>} : () -> !torch.vtensor<[5],si64>
    %17 = torch.operator "onnx.Expand"(%15, %16) : (!torch.vtensor<[1,1,2,8,16],f32>, !torch.vtensor<[5],si64>) -> !torch.vtensor<[1,2,2,8,16],f32>
    %18 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<[1, 4, 8, 16]> : tensor<4xsi64>} : () -> !torch.vtensor<[4],si64>
    %19 = torch.operator "onnx.Reshape"(%17, %18) : (!torch.vtensor<[1,2,2,8,16],f32>, !torch.vtensor<[4],si64>) -> !torch.vtensor<[1,4,8,16],f32>
    %20 = torch.operator "onnx.Transpose"(%9) {torch.onnx.perm = [0 : si64, 1 : si64, 3 : si64, 2 : si64]} : (!torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,16,8],f32>
    %21 = torch.operator "onnx.MatMul"(%arg0, %20) : (!torch.vtensor<[1,4,1,16],f32>, !torch.vtensor<[1,4,16,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %22 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<2.500000e-01> : tensor<f32>} : () -> !torch.vtensor<[],f32>
    %23 = torch.operator "onnx.Mul"(%21, %22) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %24 = torch.operator "onnx.Softmax"(%23) {torch.onnx.axis = -1 : si64} : (!torch.vtensor<[1,4,1,8],f32>) -> !torch.vtensor<[1,4,1,8],f32>
    %25 = torch.operator "onnx.MatMul"(%24, %19) : (!torch.vtensor<[1,4,1,8],f32>, !torch.vtensor<[1,4,8,16],f32>) -> !torch.vtensor<[1,4,1,16],f32>
    return %25 : !torch.vtensor<[1,4,1,16],f32>
  }
}
