// RUN: not int8attn-opt %s -p "int8-qk,no-such-pass" 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not int8attn-opt %s --pipeline "int8attn-to-linalg{pv=int4}" 2>&1 | filecheck %s --check-prefix=OPTION
// RUN: not int8attn-opt %s --pipeline "int8attn-to-linalg{tile-tokens=64x}" 2>&1 | filecheck %s --check-prefix=INTEGER
// RUN: not int8attn-opt %s --pipeline "no-such-pipeline" 2>&1 | filecheck %s --check-prefix=PIPELINE
// RUN: not int8attn-opt %s --pipeline "int8attn-to-linalg{partition-tokens=0}" 2>&1 | filecheck %s --check-prefix=POSITIVE
// RUN: not int8attn-opt %s --pipeline "int8attn-to-linalg{tile-tokens=48}" 2>&1 | filecheck %s --check-prefix=WAVES
// RUN: int8attn-opt %s --pipeline "int8attn-to-linalg{tile-tokens=48 pv=f32}"
// RUN: not int8attn-opt %s -p "canonicalize{bogus=1}" 2>&1 | filecheck %s --check-prefix=UPSTREAM

// UNKNOWN: usage: int8attn-opt
// UNKNOWN: error: unknown pass 'no-such-pass' in pipeline. int8attn passes: decode-split-kv, float-pv, fold-v-scale, int8-qk, lower-cache-write, lower-mmac-tiles, lower-paged-attention, lower-quantize, prefill-online-softmax, pv-to-mmac, quantize-w-groups, raise-int8-attention, verify-scale-groups

// OPTION: error: option 'pv' of pipeline 'int8attn-to-linalg' expects one of int8, bf16, f32, got 'int4'
// INTEGER: error: option 'tile-tokens' of pipeline 'int8attn-to-linalg' expects an integer, got '64x'
// PIPELINE: error: unknown pipeline 'no-such-pipeline'; known pipelines: int8attn-to-algorithm, int8attn-to-linalg
// POSITIVE: usage: int8attn-opt
// POSITIVE: error: pipeline 'int8attn-to-linalg': option 'partition-tokens' must be at least 1, got 0
// With pv=int8 a block must be whole 64-token waves (the float baselines take any size).
// WAVES: error: pipeline 'int8attn-to-linalg': tile-tokens=48 with pv=int8: a block of 48 tokens is not a whole number of 64-token waves (gfx936)
// UPSTREAM: error: IREE pass 'canonicalize': no such option bogus
func.func @f() {
  return
}
