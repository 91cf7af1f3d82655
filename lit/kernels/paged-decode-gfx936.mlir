// RUN: int8attn compile %s --target gfx936 --emit kernel -o - | filecheck %s

// Paged decode: one kernel module for every batch. B, NB and MB are dynamic;
// the partition count is computed by the host from the table width.
func.func @paged(%q: tensor<?x8x64xf32>, %k_cache: tensor<?x2x32x64xi8>, %k_scale: tensor<?x2x32xf32>, %v_cache: tensor<?x2x64x32xi8>, %v_scale: tensor<?x2x32xf32>, %block_tables: tensor<?x?xi32>, %context_lens: tensor<?xi32>) -> tensor<?x8x64xf32> {
  %o = "int8attn.paged_attention"(%q, %k_cache, %k_scale, %v_cache, %v_scale, %block_tables, %context_lens)
      {block_size = 32 : i64, softmax_scale = 0.125 : f32}
      : (tensor<?x8x64xf32>, tensor<?x2x32x64xi8>, tensor<?x2x32xf32>, tensor<?x2x64x32xi8>, tensor<?x2x32xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8x64xf32>
  return %o : tensor<?x8x64xf32>
}

// The pool is bound with its run-time block count; the partition's 8 block
// ids (256 tokens / 32) are read once into LDS by the first 8 threads,
// clamped to the sequence's last used table slot.
// CHECK-LABEL: stream.executable private @decode_partition
// CHECK: func.func @decode_partition(%{{.*}}: !stream.binding, %{{.*}}, %[[B:[^:]*]]: index, %[[NB:[^:]*]]: index, %[[MB:[^:]*]]: index, %[[P:[^:]*]]: index,
// CHECK-DAG: %[[IDS:.*]] = memref.alloc() alignment = 16 : memref<8xi32, #gpu.address_space<workgroup>>
// CHECK-DAG: %[[K:.*]] = stream.binding.subspan %{{.*}} -> memref<?x2x32x64xi8>{%[[NB]]}
// CHECK-DAG: %[[TABLES:.*]] = stream.binding.subspan %{{.*}} -> memref<?x?xi32>{%[[B]], %[[MB]]}
// CHECK-DAG: %[[LENS:.*]] = stream.binding.subspan %{{.*}} -> memref<?xi32>{%[[B]]}
// A workgroup past the sequence's last partition does nothing.
// CHECK: %[[LEN:.*]] = memref.load %[[LENS]]
// CHECK: %[[LIVE:.*]] = arith.cmpi slt, %[[FIRST:.*]], %{{.*}} : index
// CHECK: scf.if %[[LIVE]] {
// CHECK: stream.binding.subspan %{{.*}} -> memref<?x2x?x4x64xf32>{%[[B]], %[[P]]}
// CHECK: %[[LAST:.*]] = arith.divui %{{.*}}, %c32 : index
// CHECK: %[[READER:.*]] = arith.cmpi ult, %{{.*}}, %c8 : index
// CHECK: scf.if %[[READER]] {
// CHECK: %[[SLOT:.*]] = arith.minui %{{.*}}, %[[LAST]] : index
// CHECK: %[[ID:.*]] = memref.load %[[TABLES]][%{{.*}}, %[[SLOT]]] : memref<?x?xi32>
// CHECK: memref.store %[[ID]], %[[IDS]]
// The query rows are quantized into LDS; one barrier publishes them and the ids.
// CHECK: gpu.shuffle xor
// CHECK: gpu.barrier
// K rows are read through the staged ids, 16 bytes per lane: D = 64 is two
// K steps of 8 bytes each, in the layout's lane-contiguous head-dim order.
// CHECK: %[[BLOCK:.*]] = memref.load %[[IDS]][
// CHECK: %[[ROW:.*]] = arith.index_cast %[[BLOCK]] : i32 to index
// CHECK: %[[KB:.*]] = vector.load %[[K]][%[[ROW]], %{{.*}}, %{{.*}}, %{{.*}}] alignment = 16 : memref<?x2x32x64xi8>, vector<16xi8>
// CHECK: vector.extract_strided_slice %[[KB]] offsets = [0], sizes = [8], strides = [1]
// CHECK: llvm.call_intrinsic "llvm.amdgcn.mmac.i32.16x16x32i8"
// CHECK: vector.extract_strided_slice %[[KB]] offsets = [8], sizes = [8], strides = [1]
// CHECK: llvm.call_intrinsic "llvm.amdgcn.mmac.i32.16x16x32i8"

// The merge runs each sequence's own partition count: ceil(length / 256).
// CHECK-LABEL: stream.executable private @decode_merge
// CHECK: %[[MLEN:.*]] = arith.index_cast %{{.*}} : i32 to index
// CHECK: %[[ROUND:.*]] = arith.addi %[[MLEN]], %c255 : index
// CHECK: %[[PARTS:.*]] = arith.divui %[[ROUND]], %c256 : index
// Four thread groups, eight partitions each per iteration: group g's slot j is
// iv + g + 4j; a slot past the last re-reads it with weight 0. The first
// iteration's loads come before each row's max M (they need no M: one L2 round
// trip for both).
// CHECK: %[[LASTP:.*]] = arith.subi %[[PARTS]], %c1 : index
// CHECK: arith.minui %[[G:.*]], %[[LASTP]] : index
// CHECK: arith.cmpi ult, %[[G]], %[[PARTS]] : index
// CHECK: %[[FIRST1:.*]] = arith.addi %[[G]], %c4 : index
// CHECK: arith.minui %[[FIRST1]], %[[LASTP]] : index
// Then each row's max: the 64 lanes of a wave stride over the partitions, eight
// each per iteration (a slot past the last re-reads it: same max).
// CHECK: scf.for %{{.*}} = %c0 to %[[PARTS]] step %c512
// CHECK: arith.maximumf
// CHECK: gpu.barrier
// Then the groups' other iterations, from partition 32.
// CHECK: scf.for %[[P0:.*]] = %c32 to %[[PARTS]] step %c32
// CHECK: %[[SLOT0:.*]] = arith.addi %[[P0]], %[[G]] : index
// CHECK: arith.minui %[[SLOT0]], %[[LASTP]] : index
// CHECK: arith.cmpi ult, %[[SLOT0]], %[[PARTS]] : index
// CHECK: %[[BASE1:.*]] = arith.addi %[[P0]], %[[G]] : index
// CHECK: %[[SLOT1:.*]] = arith.addi %[[BASE1]], %c4 : index
// CHECK: arith.minui %[[SLOT1]], %[[LASTP]] : index

// CHECK-LABEL: func.func @paged(
// CHECK: %[[HB:.*]] = tensor.dim %arg0, %c0
// CHECK: %[[WIDTH:.*]] = tensor.dim %arg5, %c1
// CHECK: %[[TOKENS:.*]] = arith.muli %[[WIDTH]], %c32 : index
// CHECK: %[[HP:.*]] = arith.divui %{{.*}}, %c256 : index
// CHECK: flow.dispatch @decode_partition::@decode_partition[%[[HP]], %c2, %[[HB]]]
// CHECK: flow.dispatch @decode_merge::@decode_merge[%c2, %[[HB]]]
