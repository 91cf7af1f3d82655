// RUN: int8attn compile %s --target cuda --emit kernel -o - | filecheck %s

// The prefill of prefill-gfx936.mlir on cuda (128 new tokens ending a 4096-token
// sequence, 32 query heads over 8 KV heads, D = 128): its tiles' K, V and scales come
// through a two-stage ring in LDS that the workgroup fills with cp.async
// (kernels/kv_ring.py), the K rows' bytes through the bank swizzle derived from the K
// loads (fragments/lds_tile.py: at D 128, token bit 0 into byte bit 4).
// CHECK-LABEL: func.func @prefill_attention
// CHECK: %[[RK:.*]] = memref.alloc() alignment = 16 : memref<2x64x128xi8, #gpu.address_space<workgroup>>
// CHECK: %[[RKS:.*]] = memref.alloc() alignment = 16 : memref<2x64xf32, #gpu.address_space<workgroup>>
// CHECK: %[[RV:.*]] = memref.alloc() alignment = 16 : memref<2x128x64xi8, #gpu.address_space<workgroup>>
// CHECK: %[[RVS:.*]] = memref.alloc() alignment = 16 : memref<2x64xf32, #gpu.address_space<workgroup>>
// CHECK: %[[K:.*]] = stream.binding.subspan %arg1[%{{.*}}] : !stream.binding -> memref<1x8x4096x128xi8>
// Tile 0 into stage 0 before the loops: K and V in 16-byte copies past L1, K's bytes
// swizzled in LDS only; the 4-byte scales through L1 (cp.async.cg takes 16 bytes only).
// CHECK: %[[BIT:.*]] = arith.shli %{{.*}}, %c4 : index
// CHECK: %[[SWIZZLED:.*]] = arith.xori %[[BIT]], %[[BYTE:.*]] : index
// CHECK: nvgpu.device_async_copy %[[K]][%{{.*}}, %{{.*}}, %{{.*}}, %[[BYTE]]], %[[RK]][%c0, %{{.*}}, %[[SWIZZLED]]], 16 bypassL1
// CHECK: nvgpu.device_async_copy %{{.*}}, %[[RV]][%c0, %{{.*}}, %{{.*}}], 16 bypassL1
// CHECK: nvgpu.device_async_copy %{{.*}}, %[[RKS]][%c0, %{{.*}}], 1 :
// CHECK: nvgpu.device_async_copy %{{.*}}, %[[RVS]][%c0, %{{.*}}], 1 :
// CHECK: %[[FIRST:.*]] = nvgpu.device_async_create_group
// CHECK: nvgpu.device_async_wait %[[FIRST]] numGroups = 0
// Each tile t: a barrier (tile t's copies published, tile t - 1's reads done), then
// tile min(t + 1, last) into stage (t + 1) % 2, then tile t from stage t % 2, then the
// wait for this thread's copies.
// CHECK: scf.for %[[T:.*]] = %c0 to
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: %[[AFTER:.*]] = arith.addi %[[T]], %c1 : index
// CHECK: arith.minui %[[AFTER]], %{{.*}} : index
// CHECK: %[[OTHER:.*]] = arith.remui %{{.*}}, %c2 : index
// CHECK: nvgpu.device_async_copy %[[K]][{{.*}}], %[[RK]][%[[OTHER]], %{{.*}}, %{{.*}}], 16 bypassL1
// CHECK: %[[NEXT:.*]] = nvgpu.device_async_create_group
// CHECK: %[[STAGE:.*]] = arith.remui %[[T]], %c2 : index
// CHECK: arith.xori
// CHECK: vector.load %[[RK]][%[[STAGE]], %{{.*}}, %{{.*}}] alignment = 16
// CHECK-NOT: vector.load %[[K]]
// CHECK: vector.load %[[RV]][%[[STAGE]], %{{.*}}, %{{.*}}] alignment = 16
// CHECK-NOT: vector.load %[[K]]
// CHECK: nvgpu.device_async_wait %[[NEXT]] numGroups = 0
// CHECK-NEXT: scf.yield

// RUN: int8attn compile %s --target cuda --emit kernel --w-chain 2 -o - | filecheck %s --check-prefix=CHAIN
// --w-chain 2: a tile's two PV K-steps add into one int32 accumulator per digit (high,
// low), the second step's mma.sync taking the first's sum as its C; then per C element
// one integer join, one conversion to f32 and one FMA with the chain's W scale into the
// alpha-rescaled o (the branch's results).
// CHAIN-LABEL: func.func @prefill_attention
// CHAIN: %[[O:.*]]:32 = scf.if
// CHAIN: %[[H0:.*]] = nvgpu.mma.sync(%{{.*}}, %[[B0:.*]], %[[ZERO:.*]]) mmaShape = [16, 8, 32]
// CHAIN-NEXT: %[[L0:.*]] = nvgpu.mma.sync(%{{.*}}, %[[B0]], %[[ZERO]]) mmaShape = [16, 8, 32]
// CHAIN-NOT: arith.sitofp
// CHAIN: %[[H1:.*]] = nvgpu.mma.sync(%{{.*}}, %[[B1:.*]], %[[H0]]) mmaShape = [16, 8, 32]
// CHAIN-NEXT: %[[HE:.*]] = vector.extract %[[H1]][0, 0]
// CHAIN-NOT: arith.sitofp
// CHAIN: %[[L1:.*]] = nvgpu.mma.sync(%{{.*}}, %[[B1]], %[[L0]]) mmaShape = [16, 8, 32]
// CHAIN-NEXT: %[[LE:.*]] = vector.extract %[[L1]][0, 0]
// CHAIN: %[[SH:.*]] = arith.shli %[[HE]], %c8_i32 : i32
// CHAIN-NEXT: %[[J:.*]] = arith.addi %[[SH]], %[[LE]] : i32
// CHAIN-NEXT: %[[F:.*]] = arith.sitofp %[[J]] : i32 to f32
// CHAIN: math.fma %[[F]], %{{.*}}, %[[O]]#0 : f32
// CHAIN-NOT: nvgpu.mma.sync(%{{.*}}, %{{.*}}, %[[H1]])
// CHAIN: nvgpu.mma.sync(%{{.*}}, %{{.*}}, %[[ZERO]]) mmaShape = [16, 8, 32]

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
