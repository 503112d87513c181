// kernels/philox_math.h: Philox4x32-10, the counter-based generator of
// Salmon et al. (SC'11), also used by cuRAND and PyTorch. A pure function of
// (counter, key): the same numbers on CPU and GPU, in any thread order, with
// no state to carry between steps.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace mp::math {

struct U32x4 {
  uint32_t v[4];
};

MP_HD void mul_hi_lo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

MP_HD U32x4 philox4x32_10(U32x4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kM0, ctr.v[0], hi0, lo0);
    mul_hi_lo(kM1, ctr.v[2], hi1, lo1);
    ctr = U32x4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// The random word for element `index` of random stream `stream` under `seed`:
// word index % 4 of Philox(counter = (index / 4, stream), key = seed). Loops
// that handle four consecutive elements can call philox4x32_10 once instead.
// The word is picked with selects, not r.v[index & 3]: an array indexed at
// run time would live in local memory (a stack frame) in a CUDA kernel.
MP_HD uint32_t philox_u32(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t block = index >> 2;
  const U32x4 r = philox4x32_10(
      U32x4{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
             static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint32_t word = static_cast<uint32_t>(index & 3);
  return word == 0 ? r.v[0] : word == 1 ? r.v[1] : word == 2 ? r.v[2] : r.v[3];
}

}  // namespace mp::math
