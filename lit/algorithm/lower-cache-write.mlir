// RUN: int8attn-opt %s --split-input-file -p lower-cache-write | filecheck %s
// RUN: int8attn-opt %s --split-input-file --pipeline int8attn-to-linalg | filecheck %s --check-prefix=LINALG

// The caches of a public function become !hal.buffer_view arguments imported
// with ownership transfer (`consume`): the scatters below update the caller's
// buffers and the results are those buffers. New rows are quantized per (token,
// KV head); a skipped token (slot < 0) gets the sentinel -128 / -1.0 and index
// slot 0, which the scatter region turns into "keep the cache's value".
// CHECK-LABEL: func.func @write
// CHECK-SAME: (%[[K:[^:]*]]: tensor<?x2x64xf32>, %[[V:[^:]*]]: tensor<?x2x64xf32>, %[[S:[^:]*]]: tensor<?xi32>, %[[KCB:[^:]*]]: !hal.buffer_view, %[[KSB:[^:]*]]: !hal.buffer_view, %[[VCB:[^:]*]]: !hal.buffer_view, %[[VSB:[^:]*]]: !hal.buffer_view)
// CHECK-SAME: -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
// CHECK-DAG: %[[SKIPQ:.*]] = arith.constant -128 : i8
// CHECK-DAG: %[[SKIPS:.*]] = arith.constant -1.000000e+00 : f32
// CHECK-DAG: %[[BS:.*]] = arith.constant 16 : i32
// CHECK: %[[NB0:.*]] = hal.buffer_view.dim<%[[KCB]] : !hal.buffer_view>[0] : index
// CHECK: %[[KC:.*]] = hal.tensor.import consume %[[KCB]] "k_cache" : !hal.buffer_view -> tensor<?x2x16x64xi8>{%[[NB0]]}
// CHECK: %[[KS:.*]] = hal.tensor.import consume %[[KSB]] "k_scale" : !hal.buffer_view -> tensor<?x2x16xf32>
// CHECK: %[[VC:.*]] = hal.tensor.import consume %[[VCB]] "v_cache" : !hal.buffer_view -> tensor<?x2x64x16xi8>
// CHECK: %[[VS:.*]] = hal.tensor.import consume %[[VSB]] "v_scale" : !hal.buffer_view -> tensor<?x2x16xf32>
// CHECK: %[[KQ:.*]]:2 = "int8attn.quantize"(%[[K]]) : (tensor<?x2x64xf32>) -> (tensor<?x2x64xi8>, tensor<?x2xf32>)
// CHECK: %[[VQ:.*]]:2 = "int8attn.quantize"(%[[V]]) : (tensor<?x2x64xf32>) -> (tensor<?x2x64xi8>, tensor<?x2xf32>)
// CHECK: %[[KROWS:.*]] = linalg.generic {{.*}} ins(%[[KQ]]#0, %[[S]] : tensor<?x2x64xi8>, tensor<?xi32>)
// CHECK:   %[[SKIP:.*]] = arith.cmpi slt
// CHECK:   arith.select %[[SKIP]], %[[SKIPQ]], %{{.*}} : i8
// CHECK: %[[VROWS:.*]] = linalg.generic {{.*}} ins(%[[VQ]]#0, %[[S]] :
// CHECK: %[[KSC:.*]] = linalg.generic {{.*}} ins(%[[KQ]]#1, %[[S]] : tensor<?x2xf32>, tensor<?xi32>)
// CHECK:   arith.select %{{.*}}, %[[SKIPS]], %{{.*}} : f32
// CHECK: %[[VSC:.*]] = linalg.generic {{.*}} ins(%[[VQ]]#1, %[[S]] :
// Per (token, head): [slot / BS, head, slot % BS]; per V element: [.., head, d, ..].
// CHECK: %[[ROWIDX:.*]] = linalg.generic {{.*}} ins(%[[S]] : tensor<?xi32>) outs(%{{.*}} : tensor<?x2x3xi32>)
// CHECK:   arith.remsi %{{.*}}, %[[BS]] : i32
// CHECK:   arith.divsi %{{.*}}, %[[BS]] : i32
// CHECK: %[[ROWS:.*]] = tensor.collapse_shape %[[ROWIDX]] {{\[\[}}0, 1], [2]] : tensor<?x2x3xi32> into tensor<?x3xi32>
// CHECK: %[[ELTIDX:.*]] = linalg.generic {{.*}} ins(%[[S]] : tensor<?xi32>) outs(%{{.*}} : tensor<?x2x64x4xi32>)
// CHECK: %[[ELTS:.*]] = tensor.collapse_shape %[[ELTIDX]] {{\[\[}}0, 1, 2], [3]] : tensor<?x2x64x4xi32> into tensor<?x4xi32>
// CHECK: %[[KUPD:.*]] = tensor.collapse_shape %[[KROWS]] {{\[\[}}0, 1], [2]] : tensor<?x2x64xi8> into tensor<?x64xi8>
// CHECK: %[[NEWKC:.*]] = iree_linalg_ext.scatter dimension_map = [0, 1, 2] unique_indices(false) ins(%[[KUPD]], %[[ROWS]] : tensor<?x64xi8>, tensor<?x3xi32>) outs(%[[KC]] : tensor<?x2x16x64xi8>)
// CHECK:   ^bb0(%[[NEW:.*]]: i8, %[[OLD:.*]]: i8):
// CHECK:     %[[KEEP:.*]] = arith.cmpi eq, %[[NEW]], %[[SKIPQ]] : i8
// CHECK:     %[[PICK:.*]] = arith.select %[[KEEP]], %[[OLD]], %[[NEW]] : i8
// CHECK:     iree_linalg_ext.yield %[[PICK]] : i8
// CHECK: %[[KSUPD:.*]] = tensor.collapse_shape %[[KSC]] {{\[\[}}0, 1]] : tensor<?x2xf32> into tensor<?xf32>
// CHECK: %[[NEWKS:.*]] = iree_linalg_ext.scatter dimension_map = [0, 1, 2] unique_indices(false) ins(%[[KSUPD]], %[[ROWS]] : tensor<?xf32>, tensor<?x3xi32>) outs(%[[KS]] : tensor<?x2x16xf32>)
// CHECK:     arith.cmpf olt
// CHECK: %[[VUPD:.*]] = tensor.collapse_shape %[[VROWS]] {{\[\[}}0, 1, 2]] : tensor<?x2x64xi8> into tensor<?xi8>
// CHECK: %[[NEWVC:.*]] = iree_linalg_ext.scatter dimension_map = [0, 1, 2, 3] unique_indices(false) ins(%[[VUPD]], %[[ELTS]] : tensor<?xi8>, tensor<?x4xi32>) outs(%[[VC]] : tensor<?x2x64x16xi8>)
// CHECK: %[[VSUPD:.*]] = tensor.collapse_shape %[[VSC]] {{\[\[}}0, 1]]
// CHECK: %[[NEWVS:.*]] = iree_linalg_ext.scatter dimension_map = [0, 1, 2] unique_indices(false) ins(%[[VSUPD]], %[[ROWS]] : tensor<?xf32>, tensor<?x3xi32>) outs(%[[VS]] : tensor<?x2x16xf32>)
// CHECK: return %[[NEWKC]], %[[NEWKS]], %[[NEWVC]], %[[NEWVS]]

// LINALG-LABEL: func.func @write
// LINALG: hal.tensor.import consume
// LINALG: iree_linalg_ext.scatter
// LINALG-NOT: int8attn.
func.func @write(%k: tensor<?x2x64xf32>, %v: tensor<?x2x64xf32>, %s: tensor<?xi32>, %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>, %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %0:4 = "int8attn.cache_write"(%k, %v, %s, %kc, %ks, %vc, %vs) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %0#0, %0#1, %0#2, %0#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}

// -----

// f16 new tokens are quantized in f32 (the contract's arithmetic); static T and NB
// import without dims. A private function keeps its tensor arguments (no ABI).
// CHECK-LABEL: func.func @write_f16
// CHECK-SAME: %{{[^:]*}}: tensor<4x1x32xf16>, %{{[^:]*}}: tensor<4x1x32xf16>, %{{[^:]*}}: tensor<4xi32>, %[[KCB:[^:]*]]: !hal.buffer_view
// CHECK: hal.tensor.import consume %[[KCB]] "k_cache" : !hal.buffer_view -> tensor<8x1x32x32xi8>
// CHECK: %[[K32:.*]] = arith.extf %{{.*}} : tensor<4x1x32xf16> to tensor<4x1x32xf32>
// CHECK: "int8attn.quantize"(%[[K32]]) : (tensor<4x1x32xf32>)
// CHECK-LABEL: func.func private @inner
// CHECK-SAME: (%{{[^:]*}}: tensor<4x1x32xf16>, %{{[^:]*}}: tensor<4x1x32xf16>, %{{[^:]*}}: tensor<4xi32>, %{{[^:]*}}: tensor<8x1x32x32xi8>,
// CHECK-NOT: hal.tensor.import
// CHECK: iree_linalg_ext.scatter
func.func @write_f16(%k: tensor<4x1x32xf16>, %v: tensor<4x1x32xf16>, %s: tensor<4xi32>, %kc: tensor<8x1x32x32xi8>, %ks: tensor<8x1x32xf32>, %vc: tensor<8x1x32x32xi8>, %vs: tensor<8x1x32xf32>) -> (tensor<8x1x32x32xi8>, tensor<8x1x32xf32>, tensor<8x1x32x32xi8>, tensor<8x1x32xf32>) {
  %0:4 = "int8attn.cache_write"(%k, %v, %s, %kc, %ks, %vc, %vs) {block_size = 32 : i64} : (tensor<4x1x32xf16>, tensor<4x1x32xf16>, tensor<4xi32>, tensor<8x1x32x32xi8>, tensor<8x1x32xf32>, tensor<8x1x32x32xi8>, tensor<8x1x32xf32>) -> (tensor<8x1x32x32xi8>, tensor<8x1x32xf32>, tensor<8x1x32x32xi8>, tensor<8x1x32xf32>)
  return %0#0, %0#1, %0#2, %0#3 : tensor<8x1x32x32xi8>, tensor<8x1x32xf32>, tensor<8x1x32x32xi8>, tensor<8x1x32xf32>
}
func.func private @inner(%k: tensor<4x1x32xf16>, %v: tensor<4x1x32xf16>, %s: tensor<4xi32>, %kc: tensor<8x1x32x32xi8>, %ks: tensor<8x1x32xf32>, %vc: tensor<8x1x32x32xi8>, %vs: tensor<8x1x32xf32>) -> tensor<8x1x32x32xi8> {
  %0:4 = "int8attn.cache_write"(%k, %v, %s, %kc, %ks, %vc, %vs) {block_size = 32 : i64} : (tensor<4x1x32xf16>, tensor<4x1x32xf16>, tensor<4xi32>, tensor<8x1x32x32xi8>, tensor<8x1x32xf32>, tensor<8x1x32x32xi8>, tensor<8x1x32xf32>) -> (tensor<8x1x32x32xi8>, tensor<8x1x32xf32>, tensor<8x1x32x32xi8>, tensor<8x1x32xf32>)
  return %0#0 : tensor<8x1x32x32xi8>
}

// -----

// A conditioned K cache: the k_bias operand [Hkv, D] is subtracted from every
// new key of its KV head, in f32, before the keys are quantized; V is as before.
// CHECK-DAG: #[[ROWS:.*]] = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
// CHECK-DAG: #[[BIAS:.*]] = affine_map<(d0, d1, d2) -> (d1, d2)>
// CHECK-LABEL: func.func @write_bias
// CHECK-SAME: (%[[K:[^:]*]]: tensor<?x2x64xf32>, %[[V:[^:]*]]: tensor<?x2x64xf32>, {{.*}}, %[[B:[^:]*]]: tensor<2x64xf32>)
// CHECK: %[[KB:.*]] = linalg.generic {indexing_maps = [#[[ROWS]], #[[BIAS]], #[[ROWS]]], {{.*}} ins(%[[K]], %[[B]] : tensor<?x2x64xf32>, tensor<2x64xf32>)
// CHECK:   arith.subf
// CHECK: "int8attn.quantize"(%[[KB]])
// CHECK: "int8attn.quantize"(%[[V]])
// LINALG-LABEL: func.func @write_bias
// LINALG: arith.subf
// LINALG-NOT: int8attn.
// LINALG: return
func.func @write_bias(%a0: tensor<?x2x64xf32>, %a1: tensor<?x2x64xf32>, %a2: tensor<?xi32>, %a3: tensor<?x2x16x64xi8>, %a4: tensor<?x2x16xf32>, %a5: tensor<?x2x64x16xi8>, %a6: tensor<?x2x16xf32>, %b: tensor<2x64xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %c:4 = "int8attn.cache_write"(%a0, %a1, %a2, %a3, %a4, %a5, %a6, %b) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>, tensor<2x64xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %c#0, %c#1, %c#2, %c#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}
