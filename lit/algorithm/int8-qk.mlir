// RUN: int8attn-opt %s -p "int8-qk{q-terms=1}" | filecheck %s
// RUN: int8attn-opt %s -p "int8-qk{q-terms=2}" | filecheck %s --check-prefix=TWO
// The pass alone takes the named pipeline's default, q-terms=2:
// RUN: int8attn-opt %s -p int8-qk | filecheck %s --check-prefix=TWO

// GQA 4:1 decode: q rows are grouped by KV head, quantized per row, and the
// int32 dot product is rescaled by (sQ * c) * sK, c = softmax_scale * log2 e
// (0.125 * log2 e = 0.180336878) folded into each row's scale first: the scores
// are in log2 units.
// CHECK-LABEL: func.func @decode
// CHECK-SAME: (%[[Q:.*]]: tensor<1x8x64xf32>, %[[K:.*]]: tensor<1x2x300x64xi8>, %[[KS:.*]]: tensor<1x2x300xf32>, %[[V:.*]]: tensor<1x2x300x64xi8>, %[[VS:.*]]: tensor<1x2x300xf32>)
// CHECK-DAG: %[[C:.*]] = arith.constant 0.180336878 : f32
// CHECK: %[[QG:.*]] = tensor.expand_shape %[[Q]] {{\[\[}}0], [1, 2], [3]] output_shape [1, 2, 4, 64]
// CHECK: %[[QQ:.*]]:2 = "int8attn.quantize"(%[[QG]]) : (tensor<1x2x4x64xf32>) -> (tensor<1x2x4x64xi8>, tensor<1x2x4xf32>)
// The dot has one batch dim (b*h), the form IREE's data tiling packs (its mmt4d tiles).
// CHECK: %[[QB:.*]] = tensor.collapse_shape %[[QQ]]#0 {{\[\[}}0, 1], [2], [3]] : tensor<1x2x4x64xi8> into tensor<2x4x64xi8>
// CHECK: %[[KB:.*]] = tensor.collapse_shape %[[K]] {{\[\[}}0, 1], [2], [3]] : tensor<1x2x300x64xi8> into tensor<2x300x64xi8>
// CHECK: %[[AB:.*]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%[[QB]], %[[KB]] : tensor<2x4x64xi8>, tensor<2x300x64xi8>)
// CHECK:   arith.extsi %{{.*}} : i8 to i32
// CHECK:   arith.muli
// CHECK:   arith.addi
// CHECK: } -> tensor<2x4x300xi32>
// CHECK: %[[ACC:.*]] = tensor.expand_shape %[[AB]] {{\[\[}}0, 1], [2], [3]] output_shape [1, 2, 4, 300]
// CHECK: %[[SQC:.*]] = linalg.generic {{.*}} ins(%[[QQ]]#1 : tensor<1x2x4xf32>)
// CHECK-NEXT: ^bb0(%[[SQ:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT:   %[[RS:.*]] = arith.mulf %[[SQ]], %[[C]] : f32
// CHECK-NEXT:   linalg.yield %[[RS]] : f32
// CHECK: %[[SCORES:.*]] = linalg.generic {{.*}} ins(%[[ACC]], %[[SQC]], %[[KS]] :
// CHECK-NEXT: ^bb0(%[[A:.*]]: i32, %[[S:.*]]: f32, %[[SK:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT:   %[[F:.*]] = arith.sitofp %[[A]] : i32 to f32
// CHECK-NEXT:   %[[T:.*]] = arith.mulf %[[F]], %[[S]] : f32
// CHECK-NEXT:   %[[TK:.*]] = arith.mulf %[[T]], %[[SK]] : f32
// CHECK-NEXT:   linalg.yield %[[TK]] : f32
// CHECK: %[[O:.*]] = "int8attn.softmax_pv"(%[[SCORES]], %[[V]], %[[VS]]) {mode = "decode"} : (tensor<1x2x4x300xf32>, tensor<1x2x300x64xi8>, tensor<1x2x300xf32>) -> tensor<1x2x4x64xf32>
// CHECK: %[[R:.*]] = tensor.collapse_shape %[[O]] {{\[\[}}0], [1, 2], [3]] : tensor<1x2x4x64xf32> into tensor<1x8x64xf32>
// CHECK: return %[[R]]
// Two-term q (docs/design.md §2c): the second quantize is of the f32 residual
// q - f32(qq1)*s1, rounded once (math.fma(-qq1, s1, q)); one int32 dot per term; scores
// fma(f32(acc1), s1*c, f32(acc2)*(s2*c))*sK: the FMA written out, as LLVM would contract
// the multiply and add on a CPU with FMA.
// TWO-LABEL: func.func @decode
// TWO-SAME: (%[[Q:.*]]: tensor<1x8x64xf32>, %[[K:.*]]: tensor<1x2x300x64xi8>, %[[KS:.*]]: tensor<1x2x300xf32>,
// TWO-DAG: %[[C:.*]] = arith.constant 0.180336878 : f32
// TWO: %[[QG:.*]] = tensor.expand_shape %[[Q]]
// TWO: %[[Q1:.*]]:2 = "int8attn.quantize"(%[[QG]]) : (tensor<1x2x4x64xf32>) -> (tensor<1x2x4x64xi8>, tensor<1x2x4xf32>)
// TWO: %[[RES:.*]] = linalg.generic {{.*}} ins(%[[QG]], %[[Q1]]#0, %[[Q1]]#1 : tensor<1x2x4x64xf32>, tensor<1x2x4x64xi8>, tensor<1x2x4xf32>)
// TWO-NEXT: ^bb0(%[[X:.*]]: f32, %[[QI:.*]]: i8, %[[SI:.*]]: f32, %{{.*}}: f32):
// TWO-NEXT:   %[[QF:.*]] = arith.sitofp %[[QI]] : i8 to f32
// TWO-NEXT:   %[[NQ:.*]] = arith.negf %[[QF]] : f32
// TWO-NEXT:   %[[D:.*]] = math.fma %[[NQ]], %[[SI]], %[[X]] : f32
// TWO-NEXT:   linalg.yield %[[D]] : f32
// TWO: %[[Q2:.*]]:2 = "int8attn.quantize"(%[[RES]]) : (tensor<1x2x4x64xf32>) -> (tensor<1x2x4x64xi8>, tensor<1x2x4xf32>)
// TWO: %[[Q1B:.*]] = tensor.collapse_shape %[[Q1]]#0 {{\[\[}}0, 1], [2], [3]]
// TWO: %[[K1B:.*]] = tensor.collapse_shape %[[K]] {{\[\[}}0, 1], [2], [3]]
// TWO: %[[A1B:.*]] = linalg.generic {{.*}} ins(%[[Q1B]], %[[K1B]] : tensor<2x4x64xi8>, tensor<2x300x64xi8>)
// TWO: %[[ACC1:.*]] = tensor.expand_shape %[[A1B]] {{\[\[}}0, 1], [2], [3]] output_shape [1, 2, 4, 300]
// TWO: %[[Q2B:.*]] = tensor.collapse_shape %[[Q2]]#0 {{\[\[}}0, 1], [2], [3]]
// TWO: %[[K2B:.*]] = tensor.collapse_shape %[[K]] {{\[\[}}0, 1], [2], [3]]
// TWO: %[[A2B:.*]] = linalg.generic {{.*}} ins(%[[Q2B]], %[[K2B]] : tensor<2x4x64xi8>, tensor<2x300x64xi8>)
// TWO: %[[ACC2:.*]] = tensor.expand_shape %[[A2B]] {{\[\[}}0, 1], [2], [3]] output_shape [1, 2, 4, 300]
// TWO: %[[S1C:.*]] = linalg.generic {{.*}} ins(%[[Q1]]#1 : tensor<1x2x4xf32>)
// TWO: arith.mulf %{{.*}}, %[[C]] : f32
// TWO: %[[S2C:.*]] = linalg.generic {{.*}} ins(%[[Q2]]#1 : tensor<1x2x4xf32>)
// TWO: arith.mulf %{{.*}}, %[[C]] : f32
// TWO: %[[SCORES:.*]] = linalg.generic {{.*}} ins(%[[ACC1]], %[[S1C]], %[[ACC2]], %[[S2C]], %[[KS]] :
// TWO-NEXT: ^bb0(%[[A1:.*]]: i32, %[[S1:.*]]: f32, %[[A2:.*]]: i32, %[[S2:.*]]: f32, %[[SK:.*]]: f32, %{{.*}}: f32):
// TWO-NEXT:   %[[F1:.*]] = arith.sitofp %[[A1]] : i32 to f32
// TWO-NEXT:   %[[F2:.*]] = arith.sitofp %[[A2]] : i32 to f32
// TWO-NEXT:   %[[T2:.*]] = arith.mulf %[[F2]], %[[S2]] : f32
// TWO-NEXT:   %[[SUM:.*]] = math.fma %[[F1]], %[[S1]], %[[T2]] : f32
// TWO-NEXT:   %[[TK:.*]] = arith.mulf %[[SUM]], %[[SK]] : f32
// TWO-NEXT:   linalg.yield %[[TK]] : f32
// TWO: "int8attn.softmax_pv"(%[[SCORES]],
// TWO-LABEL: func.func @decode_f16
// TWO-COUNT-2: "int8attn.quantize"
// TWO-LABEL: func.func @prefill
// TWO-COUNT-2: "int8attn.quantize"
// TWO: "int8attn.softmax_pv"
func.func @decode(%q: tensor<1x8x64xf32>, %k: tensor<1x2x300x64xi8>, %ks: tensor<1x2x300xf32>, %v: tensor<1x2x300x64xi8>, %vs: tensor<1x2x300xf32>) -> tensor<1x8x64xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.125 : f32} : (tensor<1x8x64xf32>, tensor<1x2x300x64xi8>, tensor<1x2x300xf32>, tensor<1x2x300x64xi8>, tensor<1x2x300xf32>) -> tensor<1x8x64xf32>
  return %o : tensor<1x8x64xf32>
}

// f16 queries are computed in f32.
// CHECK-LABEL: func.func @decode_f16
// CHECK: %[[EXT:.*]] = arith.extf %{{.*}} : tensor<1x4x16xf16> to tensor<1x4x16xf32>
// CHECK: tensor.expand_shape %[[EXT]]
func.func @decode_f16(%q: tensor<1x4x16xf16>, %k: tensor<1x4x33x16xi8>, %ks: tensor<1x4x33xf32>, %v: tensor<1x4x33x16xi8>, %vs: tensor<1x4x33xf32>) -> tensor<1x4x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x4x16xf16>, tensor<1x4x33x16xi8>, tensor<1x4x33xf32>, tensor<1x4x33x16xi8>, tensor<1x4x33xf32>) -> tensor<1x4x16xf32>
  return %o : tensor<1x4x16xf32>
}

// Prefill rows are (head, query token) pairs, head-major, and the query
// token count travels on softmax_pv for the causal mask.
// CHECK-LABEL: func.func @prefill
// CHECK: %[[HEADS:.*]] = tensor.expand_shape %{{.*}} {{\[\[}}0], [1, 2], [3], [4]] output_shape [1, 2, 2, 3, 16]
// CHECK: %[[ROWS:.*]] = tensor.collapse_shape %[[HEADS]] {{\[\[}}0], [1], [2, 3], [4]] : tensor<1x2x2x3x16xf32> into tensor<1x2x6x16xf32>
// CHECK: "int8attn.quantize"(%[[ROWS]])
// CHECK: %[[O:.*]] = "int8attn.softmax_pv"({{.*}}) {mode = "prefill", query_tokens = 3 : i64} : (tensor<1x2x6x40xf32>, tensor<1x2x40x16xi8>, tensor<1x2x40xf32>) -> tensor<1x2x6x16xf32>
// CHECK: %[[E:.*]] = tensor.expand_shape %[[O]] {{\[\[}}0], [1], [2, 3], [4]] output_shape [1, 2, 2, 3, 16]
// CHECK: %[[R:.*]] = tensor.collapse_shape %[[E]] {{\[\[}}0], [1, 2], [3], [4]] : tensor<1x2x2x3x16xf32> into tensor<1x4x3x16xf32>
// CHECK: return %[[R]]
func.func @prefill(%q: tensor<1x4x3x16xf32>, %k: tensor<1x2x40x16xi8>, %ks: tensor<1x2x40xf32>, %v: tensor<1x2x40x16xi8>, %vs: tensor<1x2x40xf32>) -> tensor<1x4x3x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "prefill", softmax_scale = 0.25 : f32} : (tensor<1x4x3x16xf32>, tensor<1x2x40x16xi8>, tensor<1x2x40xf32>, tensor<1x2x40x16xi8>, tensor<1x2x40xf32>) -> tensor<1x4x3x16xf32>
  return %o : tensor<1x4x3x16xf32>
}
