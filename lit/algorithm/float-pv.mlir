// RUN: int8attn-opt %s -p "float-pv{pv=f32}" | filecheck %s --check-prefix=F32
// RUN: int8attn-opt %s -p "float-pv{pv=bf16}" | filecheck %s --check-prefix=BF16

// F32-LABEL: func.func @baseline
// F32-SAME: (%[[W:.*]]: tensor<1x2x4x2x256xf32>, %[[V:.*]]: tensor<1x2x2x256x16xi8>, %[[O0:.*]]: tensor<1x2x4x2x16xf32>)
// The contraction accumulates into the op's acc operand.
// F32: %[[O:.*]] = linalg.generic {{.*}} ins(%[[W]], %[[V]] : {{.*}}) outs(%[[O0]] :
// F32-NEXT: ^bb0(%[[WI:.*]]: f32, %[[VI:.*]]: i8, %[[ACC:.*]]: f32):
// F32-NEXT:   %[[VF:.*]] = arith.sitofp %[[VI]] : i8 to f32
// F32-NEXT:   %[[P:.*]] = arith.mulf %[[WI]], %[[VF]]
// F32-NEXT:   %[[S:.*]] = arith.addf %[[ACC]], %[[P]]
// F32-NEXT:   linalg.yield %[[S]]
// F32: return %[[O]]

// W is rounded to bf16 (ties to even) on its bits, then accumulated in f32.
// BF16-LABEL: func.func @baseline
// BF16: ^bb0(%[[WI:.*]]: f32, %[[VI:.*]]: i8, %[[ACC:.*]]: f32):
// BF16:   %[[BITS:.*]] = arith.bitcast %[[WI]] : f32 to i32
// BF16:   %[[HI:.*]] = arith.shrui %[[BITS]], %{{.*}}
// BF16:   %[[LSB:.*]] = arith.andi %[[HI]]
// BF16:   %[[BIAS:.*]] = arith.addi %[[LSB]], %{{.*}}
// BF16:   %[[SUM:.*]] = arith.addi %[[BITS]], %[[BIAS]]
// BF16:   %[[MASKED:.*]] = arith.andi %[[SUM]], %{{.*}}
// BF16:   %[[WB:.*]] = arith.bitcast %[[MASKED]] : i32 to f32
// BF16:   arith.mulf %[[WB]]
func.func @baseline(%w: tensor<1x2x4x2x256xf32>, %v: tensor<1x2x2x256x16xi8>, %acc: tensor<1x2x4x2x16xf32>) -> tensor<1x2x4x2x16xf32> {
  %o = "int8attn.folded_pv"(%w, %v, %acc) : (tensor<1x2x4x2x256xf32>, tensor<1x2x2x256x16xi8>, tensor<1x2x4x2x16xf32>) -> tensor<1x2x4x2x16xf32>
  return %o : tensor<1x2x4x2x16xf32>
}
