// core/crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78,
// initial value and final xor 0xFFFFFFFF), as TFRecord, iSCSI, ext4 and our
// checkpoints use it: crc32c("123456789") == 0xE3069283.
//
// x86-64 CPUs with SSE4.2 run the crc32 instruction, three independent
// streams at a time (about 10-20 GB/s per core, faster than the disk writes
// it guards); elsewhere a table, 8 bytes per step (about 1-2 GB/s).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace mp {

uint32_t crc32c(std::string_view bytes);

// Extends a finished CRC with more bytes: crc32c_extend(crc32c(a), b) ==
// crc32c(a + b); crc32c_extend(0, b) == crc32c(b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size);

// Whether the hardware path is in use (for benchmarks and logs).
bool crc32c_hardware();

}  // namespace mp
