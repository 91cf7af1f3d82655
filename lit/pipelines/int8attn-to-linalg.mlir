// RUN: int8attn-opt %s --pipeline "int8attn-to-linalg" | filecheck %s --check-prefixes=INT8,INPLACE
// RUN: int8attn-opt %s --pipeline "int8attn-to-linalg{pv=bf16}" | filecheck %s --check-prefix=FLOAT
// RUN: int8attn-opt %s --pipeline "int8attn-to-linalg{pv=f32}" | filecheck %s --check-prefix=FLOAT
// RUN: int8attn-opt %s --pipeline "int8attn-to-linalg" --print-ir-after-all 2>&1 >/dev/null | filecheck %s --check-prefix=STAGES
// RUN: not int8attn-opt %s --pipeline "int8attn-to-linalg{scale-groups=contiguous}" 2>&1 | filecheck %s --check-prefix=BUG
// RUN: int8attn-opt %s --pipeline "int8attn-to-linalg{scale-groups=contiguous verify=false}" | filecheck %s --check-prefix=INT8
// RUN: int8attn-opt %s --pipeline "int8attn-to-linalg{w-quant=u8 q-terms=2}" | filecheck %s --check-prefix=U8

// The whole pipeline leaves only standard dialects. INT8 PV keeps exact
// per-group sums (accumulated in f32, exact for int8 products, as int32
// tiles), reading W and V in place (no token gather; contiguous (wrong)
// scale groups still gather W for their absmax); the baselines contract in f32.
// INT8-LABEL: func.func @decode
// INT8-NOT: int8attn.
// INT8: arith.fptosi %{{.*}} : f32 to i8
// INT8: arith.muli
// INPLACE-NOT: = tensor.extract %
// INT8: arith.fptosi %{{.*}} : f32 to i32
// INT8: into tensor<1x2x4x2x8x64xi32>
// INPLACE-NOT: = tensor.extract %
// INT8-NOT: int8attn.
// INT8: return

// Unsigned W: Wq = u - 128 (a subtraction of 128 before the i8 truncation);
// the in-place tiles sum u * Vq (u = Wq + 128 where Wq becomes f32), so no
// column sums are left.
// U8-LABEL: func.func @decode
// U8-DAG: %[[C128:.*]] = arith.constant 128 : i32
// U8-DAG: %[[F128:.*]] = arith.constant 1.280000e+02 : f32
// U8: arith.subi %{{.*}}, %[[C128]] : i32
// U8: %[[W:.*]] = arith.sitofp %{{.*}} : i8 to f32
// U8: arith.addf %[[W]], %[[F128]] : f32
// U8-NOT: int8attn.
// U8: return

// FLOAT-LABEL: func.func @decode
// FLOAT-NOT: int8attn.
// FLOAT-NOT: tensor<1x2x4x2x8x64xi32>
// FLOAT: arith.sitofp %{{.*}} : i8 to f32
// FLOAT: return

// Contiguous (wrong) W groups are rejected by default, at the graph's location.
// BUG: int8attn-to-linalg.mlir:[[# @LINE + 21]]:8: error: W scale of group 0 is computed over tokens {0-31} but the MMAC consuming its quantized values reads tokens {0-7,16-23,32-39,48-55}

// STAGES: IR Dump After int8-qk
// STAGES: "int8attn.softmax_pv"
// STAGES: IR Dump After decode-split-kv{partition-tokens=256}
// STAGES: "int8attn.pv"
// STAGES: IR Dump After prefill-online-softmax{tile-tokens=64}
// STAGES: IR Dump After fold-v-scale
// STAGES: "int8attn.folded_pv"
// STAGES: IR Dump After quantize-w-groups{fragment-model=gfx936 scale-groups=fragment
// STAGES: "int8attn.group_quantize"
// STAGES: "int8attn.grouped_pv"
// STAGES: IR Dump After verify-scale-groups
// STAGES: IR Dump After pv-to-mmac{fragment-model=gfx936 w-chain=1}
// STAGES: "int8attn.mmac_tiles"
// STAGES: IR Dump After verify-scale-groups
// STAGES: IR Dump After lower-mmac-tiles
// STAGES: IR Dump After lower-quantize
// STAGES: IR Dump After CanonicalizerPass
// STAGES: IR Dump After CSEPass
func.func @decode(%q: tensor<1x8x64xf32>, %k: tensor<1x2x300x64xi8>, %ks: tensor<1x2x300xf32>, %v: tensor<1x2x300x64xi8>, %vs: tensor<1x2x300xf32>) -> tensor<1x8x64xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.125 : f32} : (tensor<1x8x64xf32>, tensor<1x2x300x64xi8>, tensor<1x2x300xf32>, tensor<1x2x300x64xi8>, tensor<1x2x300xf32>) -> tensor<1x8x64xf32>
  return %o : tensor<1x8x64xf32>
}

// Prefill lowers through the same INT8 PV passes inside its tile loop
// (3 tiles; canonicalize folds a one-tile loop away).
// INT8-LABEL: func.func @prefill
// INT8: scf.for
// INT8-NOT: int8attn.
// INT8: arith.fptosi %{{.*}} : f32 to i32
// INT8: -> tensor<1x1x6x1x2x16xi32>
// INT8: scf.yield
func.func @prefill(%q: tensor<1x2x3x16xf32>, %k: tensor<1x1x130x16xi8>, %ks: tensor<1x1x130xf32>, %v: tensor<1x1x130x16xi8>, %vs: tensor<1x1x130xf32>) -> tensor<1x2x3x16xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "prefill", softmax_scale = 0.25 : f32} : (tensor<1x2x3x16xf32>, tensor<1x1x130x16xi8>, tensor<1x1x130xf32>, tensor<1x1x130x16xi8>, tensor<1x1x130xf32>) -> tensor<1x2x3x16xf32>
  return %o : tensor<1x2x3x16xf32>
}
