#include "core/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mp {
namespace {

// kTables[k][b]: the register after shifting byte b and then k zero bytes
// through it (slicing-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    t[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
  return t;
}
constexpr Tables kTables = make_tables();

// Raw register update (no pre/post inversion).
uint32_t update_table(uint32_t crc, const uint8_t* p, size_t n) {
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = kTables[7][v & 0xFF] ^ kTables[6][(v >> 8) & 0xFF] ^ kTables[5][(v >> 16) & 0xFF] ^
          kTables[4][(v >> 24) & 0xFF] ^ kTables[3][(v >> 32) & 0xFF] ^ kTables[2][(v >> 40) & 0xFF] ^
          kTables[1][(v >> 48) & 0xFF] ^ kTables[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = kTables[0][(crc ^ *p++) & 0xFFu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// a(x) b(x) mod P in the reflected domain (bit 31 is x^0). Used to combine
// the three parallel streams; bitwise, as it runs once per 3 * kStripe bytes.
uint32_t gf2_multiply(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int i = 0; i < 32; ++i) {
    if (b & 0x80000000u) product ^= a;  // reflected: bit 31 of b is x^0
    b <<= 1;
    a = (a & 1u) ? (a >> 1) ^ 0x82F63B78u : a >> 1;
  }
  return product;
}

// x^(8 * bytes - 32) mod P in the reflected domain. A register R shifted
// over `bytes` zero bytes is R x^(8 bytes); the crc32 instruction on a
// 32-bit value v from a zero register gives v x^32, so
// crc32_u32(0, R * shift_factor(bytes)) is that shift.
uint32_t shift_factor(size_t bytes) {
  uint32_t f = 0x80000000u;  // x^0; then multiply by x, one bit at a time
  for (size_t i = 0; i < 8 * bytes - 32; ++i) f = (f & 1u) ? (f >> 1) ^ 0x82F63B78u : f >> 1;
  return f;
}

constexpr size_t kStripe = 8192;  // bytes per stream per round

[[gnu::target("sse4.2")]] uint32_t update_sse42(uint32_t crc, const uint8_t* p, size_t n) {
  static const uint32_t kShift1 = shift_factor(kStripe), kShift2 = shift_factor(2 * kStripe);
  while (n >= 3 * kStripe) {
    uint64_t c0 = crc, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStripe; i += 8) {
      uint64_t a, b, c;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + kStripe + i, 8);
      std::memcpy(&c, p + 2 * kStripe + i, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, c);
    }
    // The register is linear: after s0 s1 s2 it is c0 shifted over two
    // stripes, plus c1 shifted over one, plus c2.
    const uint32_t f0 = gf2_multiply(static_cast<uint32_t>(c0), kShift2);
    const uint32_t f1 = gf2_multiply(static_cast<uint32_t>(c1), kShift1);
    crc = static_cast<uint32_t>(_mm_crc32_u32(0, f0 ^ f1)) ^ static_cast<uint32_t>(c2);
    p += 3 * kStripe;
    n -= 3 * kStripe;
  }
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  crc = static_cast<uint32_t>(c);
  while (n-- > 0) crc = _mm_crc32_u8(crc, *p++);
  return crc;
}

bool has_sse42() { return __builtin_cpu_supports("sse4.2") != 0; }
#endif

}  // namespace

bool crc32c_hardware() {
#if defined(__x86_64__)
  static const bool hw = has_sse42();
  return hw;
#else
  return false;
#endif
}

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t r = ~crc;
#if defined(__x86_64__)
  if (crc32c_hardware()) return ~update_sse42(r, p, size);
#endif
  return ~update_table(r, p, size);
}

uint32_t crc32c(std::string_view bytes) { return crc32c_extend(0, bytes.data(), bytes.size()); }

}  // namespace mp
