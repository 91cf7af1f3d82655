// RUN: int8attn-opt %s --split-input-file -p lower-quantize | filecheck %s

// a = max|x|, s = (a == inf ? NaN : a/127),
// inv = (a >= 2^-118 and a < inf ? 127/a : 0), q = (inv == 0 ? 0 : rne(clamp(x*inv))),
// rne(y) = y + 1.5*2^23 - 1.5*2^23 (exact for |y| <= 2^22; the clamp first keeps the
// product from being contracted into an fma with the add). Against the row's own
// absmax only the lower bound is built: x*inv <= 127 + ulp(127) rounds to 127.
// CHECK-LABEL: func.func @rows
// CHECK-SAME: (%[[X:.*]]: tensor<2x4x64xf32>)
// CHECK-DAG: %[[QMAX:.*]] = arith.constant 1.270000e+02 : f32
// CHECK-DAG: %[[QMIN:.*]] = arith.constant -1.270000e+02 : f32
// CHECK-DAG: %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-DAG: %[[INF:.*]] = arith.constant 0x7F800000 : f32
// CHECK-DAG: %[[NAN:.*]] = arith.constant 0x7FC00000 : f32
// CHECK-DAG: %[[TINY:.*]] = arith.constant 3.0092655{{[0-9]}}E-36 : f32
// CHECK-DAG: %[[BIAS:.*]] = arith.constant 0x4B400000 : f32
// CHECK: %[[AMAX:.*]] = linalg.generic {{.*}} ins(%[[X]] : tensor<2x4x64xf32>)
// CHECK:   %[[ABS:.*]] = math.absf
// CHECK:   arith.maximumf %{{.*}}, %[[ABS]]
// CHECK: %[[SCALE:.*]] = linalg.generic {{.*}} ins(%[[AMAX]] :
// CHECK:   %[[IS_INF:.*]] = arith.cmpf oeq, %{{.*}}, %[[INF]]
// CHECK:   %[[S:.*]] = arith.divf %{{.*}}, %[[QMAX]]
// CHECK:   arith.select %[[IS_INF]], %[[NAN]], %[[S]]
// CHECK: %[[INV:.*]] = linalg.generic {{.*}} ins(%[[AMAX]] :
// CHECK:   %[[BIG:.*]] = arith.cmpf oge, %[[A:.*]], %[[TINY]]
// CHECK:   %[[FINITE:.*]] = arith.cmpf olt, %[[A]], %[[INF]]
// CHECK:   %[[OK:.*]] = arith.andi %[[BIG]], %[[FINITE]]
// CHECK:   %[[RECIP:.*]] = arith.divf %[[QMAX]], %[[A]]
// CHECK:   arith.select %[[OK]], %[[RECIP]], %[[ZERO]]
// CHECK: %[[Q:.*]] = linalg.generic {{.*}} ins(%[[X]], %[[INV]] :
// CHECK:   %[[Y:.*]] = arith.mulf
// CHECK:   %[[LO:.*]] = arith.maximumf %[[Y]], %[[QMIN]]
// CHECK-NOT: arith.minimumf
// CHECK:   %[[BIASED:.*]] = arith.addf %[[LO]], %[[BIAS]]
// CHECK:   %[[R:.*]] = arith.subf %[[BIASED]], %[[BIAS]]
// CHECK:   %[[SKIP:.*]] = arith.cmpf oeq, %{{.*}}, %[[ZERO]]
// CHECK:   %[[SEL:.*]] = arith.select %[[SKIP]], %[[ZERO]], %[[R]]
// CHECK:   arith.fptosi %[[SEL]] : f32 to i8
// CHECK: return %[[Q]], %[[SCALE]]
func.func @rows(%x: tensor<2x4x64xf32>) -> (tensor<2x4x64xi8>, tensor<2x4xf32>) {
  %q:2 = "int8attn.quantize"(%x) : (tensor<2x4x64xf32>) -> (tensor<2x4x64xi8>, tensor<2x4xf32>)
  return %q#0, %q#1 : tensor<2x4x64xi8>, tensor<2x4xf32>
}

// -----

// Group quantization reads W in place: its token dim is viewed as the
// groups' digits (gfx936, one wave: token = 16*r + 8*t + j -> [4, 2, 8]); the
// absmax of group t reduces its slot digits (r, j), and Wq is written in
// [G, K] = [t, (r, j)] order straight from that view (no gather, no copy).
// CHECK-DAG: #[[TOKENS:.*]] = affine_map<(d0, d1, d2, d3) -> (d0, d2, d1, d3)>
// CHECK-DAG: #[[GROUP:.*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1)>
// CHECK-DAG: #[[GROUP_ORDER:.*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
// CHECK-LABEL: func.func @groups
// CHECK-SAME: (%[[W:.*]]: tensor<3x64xf32>)
// CHECK-NOT: tensor.extract
// CHECK: %[[WV:.*]] = tensor.expand_shape %[[W]] {{\[\[}}0], [1, 2, 3]] output_shape [3, 4, 2, 8] : tensor<3x64xf32> into tensor<3x4x2x8xf32>
// CHECK: %[[AMAX:.*]] = linalg.generic {indexing_maps = [#[[TOKENS]], #[[GROUP]]], iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%[[WV]] : tensor<3x4x2x8xf32>) outs(%{{.*}} : tensor<3x2xf32>)
// CHECK:   math.absf
// CHECK:   arith.maximumf
// CHECK: %[[SCALE:.*]] = linalg.generic {{.*}} ins(%[[AMAX]] : tensor<3x2xf32>)
// CHECK: %[[INV:.*]] = linalg.generic {{.*}} ins(%[[AMAX]] : tensor<3x2xf32>)
// CHECK: %[[Q:.*]] = linalg.generic {indexing_maps = [#[[TOKENS]], #[[GROUP]], #[[GROUP_ORDER]]], {{.*}} ins(%[[WV]], %[[INV]] : tensor<3x4x2x8xf32>, tensor<3x2xf32>) outs(%{{.*}} : tensor<3x2x4x8xi8>)
// CHECK:   arith.addf
// CHECK:   arith.subf
// CHECK:   arith.fptosi %{{.*}} : f32 to i8
// CHECK: %[[WQ:.*]] = tensor.collapse_shape %[[Q]] {{\[\[}}0], [1], [2, 3]] : tensor<3x2x4x8xi8> into tensor<3x2x32xi8>
// CHECK: return %[[WQ]], %[[SCALE]]
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @groups(%w: tensor<3x64xf32>) -> (tensor<3x2x32xi8>, tensor<3x2xf32>) {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups} : (tensor<3x64xf32>) -> (tensor<3x2x32xi8>, tensor<3x2xf32>)
  return %q#0, %q#1 : tensor<3x2x32xi8>, tensor<3x2xf32>
}

// -----

// A table that is no permutation of the token index's digits (token 31 and
// 63 trade groups) gathers W into [G, K] fragment order first.
// CHECK-LABEL: func.func @no_digit_permutation
// CHECK: %[[TABLE:.*]] = arith.constant dense<{{\[\[}}0, 1, 2, {{.*}}, 30, 63], [31, 32, {{.*}} : tensor<2x32xi64>
// CHECK: %[[WG:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<3x2x32xf32>)
// CHECK:   tensor.extract %[[TABLE]]
// CHECK: linalg.generic {{.*}} ins(%[[WG]] : tensor<3x2x32xf32>) outs(%{{.*}} : tensor<3x2xf32>)
// CHECK:   math.absf
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 63>,
           array<i64: 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62>]
func.func @no_digit_permutation(%w: tensor<3x64xf32>) -> (tensor<3x2x32xi8>, tensor<3x2xf32>) {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups} : (tensor<3x64xf32>) -> (tensor<3x2x32xi8>, tensor<3x2xf32>)
  return %q#0, %q#1 : tensor<3x2x32xi8>, tensor<3x2xf32>
}

// -----

// Unsigned W (w_quant = "u8"): the same in-place view and absmax, scale a/255,
// inverse 255/a (0 where skipped), u = rne(clamp(W * inv, 0, 255))
// stored as the s8 u - 128 (the bound 255 implied: W against its group's own absmax).
// CHECK-LABEL: func.func @unsigned_groups
// CHECK-SAME: (%[[W:.*]]: tensor<3x64xf32>)
// CHECK-DAG: %[[C128:.*]] = arith.constant 128 : i32
// CHECK-DAG: %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-DAG: %[[U8MAX:.*]] = arith.constant 2.550000e+02 : f32
// CHECK: %[[WV:.*]] = tensor.expand_shape %[[W]] {{\[\[}}0], [1, 2, 3]] output_shape [3, 4, 2, 8]
// CHECK: %[[AMAX:.*]] = linalg.generic {{.*}} ins(%[[WV]] : tensor<3x4x2x8xf32>) outs(%{{.*}} : tensor<3x2xf32>)
// CHECK: %[[SCALE:.*]] = linalg.generic {{.*}} ins(%[[AMAX]] : tensor<3x2xf32>)
// CHECK:   arith.divf %{{.*}}, %[[U8MAX]] : f32
// CHECK: %[[INV:.*]] = linalg.generic {{.*}} ins(%[[AMAX]] : tensor<3x2xf32>)
// CHECK:   arith.divf %[[U8MAX]], %{{.*}} : f32
// CHECK: %[[Q:.*]] = linalg.generic {{.*}} ins(%[[WV]], %[[INV]] : tensor<3x4x2x8xf32>, tensor<3x2xf32>) outs(%{{.*}} : tensor<3x2x4x8xi8>)
// CHECK:   %[[LOW:.*]] = arith.maximumf %{{.*}}, %[[ZERO]] : f32
// CHECK-NOT: arith.minimumf
// CHECK:   %[[BIASED:.*]] = arith.addf %[[LOW]],
// CHECK:   %[[STEPS:.*]] = arith.subf %[[BIASED]]
// CHECK:   %[[UI:.*]] = arith.fptosi %{{.*}} : f32 to i32
// CHECK:   %[[S:.*]] = arith.subi %[[UI]], %[[C128]] : i32
// CHECK:   arith.trunci %[[S]] : i32 to i8
// CHECK: %[[WQ:.*]] = tensor.collapse_shape %[[Q]]
// CHECK: return %[[WQ]], %[[SCALE]]
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @unsigned_groups(%w: tensor<3x64xf32>) -> (tensor<3x2x32xi8>, tensor<3x2xf32>) {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups, w_quant = "u8"} : (tensor<3x64xf32>) -> (tensor<3x2x32xi8>, tensor<3x2xf32>)
  return %q#0, %q#1 : tensor<3x2x32xi8>, tensor<3x2xf32>
}

// -----

// Contiguous (wrong) W groups on request (scale_groups other than groups, which verify-scale-groups
// would refuse): each group is quantized against the absmax of other tokens, so a value
// may exceed it and the clamp is whole.
// CHECK-LABEL: func.func @contiguous_groups
// CHECK-DAG: %[[QMAX:.*]] = arith.constant 1.270000e+02 : f32
// CHECK-DAG: %[[QMIN:.*]] = arith.constant -1.270000e+02 : f32
// CHECK: linalg.generic
// CHECK:   %[[Y:.*]] = arith.mulf
// CHECK:   %[[LO:.*]] = arith.maximumf %[[Y]], %[[QMIN]]
// CHECK:   %[[HI:.*]] = arith.minimumf %[[LO]], %[[QMAX]]
// CHECK:   arith.addf %[[HI]],
#groups = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55>,
           array<i64: 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63>]
#contiguous = [array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31>,
               array<i64: 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63>]
func.func @contiguous_groups(%w: tensor<3x64xf32>) -> (tensor<3x2x32xi8>, tensor<3x2xf32>) {
  %q:2 = "int8attn.group_quantize"(%w) {groups = #groups, scale_groups = #contiguous} : (tensor<3x64xf32>) -> (tensor<3x2x32xi8>, tensor<3x2xf32>)
  return %q#0, %q#1 : tensor<3x2x32xi8>, tensor<3x2xf32>
}
