// tests/reference_float.h: a plain float64 reference for narrow float
// formats, written independently of kernels/convert_math.h: decode with
// ldexp, round by searching the sorted table of representable values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace mp::testing {

struct RefFormat {
  int exp_bits;
  int man_bits;
  bool ieee;  // all-ones exponent is Inf/NaN; otherwise only the all-ones pattern is NaN
};
inline constexpr RefFormat kRefBF16{8, 7, true};
inline constexpr RefFormat kRefFP16{5, 10, true};
inline constexpr RefFormat kRefE4M3{4, 3, false};
inline constexpr RefFormat kRefE5M2{5, 2, true};

inline int ref_bits(RefFormat f) { return 1 + f.exp_bits + f.man_bits; }

inline double ref_decode(uint32_t bits, RefFormat f) {
  const uint32_t sign = (bits >> (f.exp_bits + f.man_bits)) & 1;
  const uint32_t exp = (bits >> f.man_bits) & ((1u << f.exp_bits) - 1);
  const uint32_t man = bits & ((1u << f.man_bits) - 1);
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const uint32_t exp_max = (1u << f.exp_bits) - 1;
  double v;
  if (f.ieee && exp == exp_max) {
    v = man ? std::nan("") : INFINITY;
  } else if (!f.ieee && exp == exp_max && man == (1u << f.man_bits) - 1) {
    v = std::nan("");
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>(man + (1u << f.man_bits)), static_cast<int>(exp) - bias - f.man_bits);
  }
  return sign ? -v : v;
}

// Nearest-even rounding of any double to the format, by table search.
class RefRounder {
 public:
  explicit RefRounder(RefFormat f) : f_(f) {
    const uint32_t positive_patterns = 1u << (f.exp_bits + f.man_bits);
    for (uint32_t b = 0; b < positive_patterns; ++b) {
      const double v = ref_decode(b, f);
      if (std::isfinite(v)) table_.emplace_back(v, b);
    }
    std::sort(table_.begin(), table_.end());
  }

  // Returns the bit pattern; for NaN input returns any NaN pattern (the
  // caller checks NaN-ness separately).
  uint32_t round(double x) const {
    const uint32_t sign_bit = 1u << (f_.exp_bits + f_.man_bits);
    const uint32_t sign = std::signbit(x) ? sign_bit : 0;
    if (std::isnan(x)) return sign_bit - 1;  // all ones: NaN in every format here
    const double a = std::fabs(x);
    const auto& [max_value, max_bits] = table_.back();
    if (a > max_value) {
      if (!f_.ieee) return sign | max_bits;  // saturate
      const double gap = max_value - table_[table_.size() - 2].first;
      const uint32_t inf_bits = ((1u << f_.exp_bits) - 1) << f_.man_bits;
      // Tie at max + gap/2 goes to Inf: max has an odd mantissa.
      return sign | (a >= max_value + gap / 2 ? inf_bits : max_bits);
    }
    auto hi = std::lower_bound(table_.begin(), table_.end(), std::make_pair(a, 0u));
    if (hi->first == a) return sign | hi->second;
    auto lo = hi - 1;
    const double dl = a - lo->first, dh = hi->first - a;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | hi->second;
    return sign | ((lo->second & 1) == 0 ? lo->second : hi->second);
  }

  // The two representable neighbours of finite |x| within range: lo <= |x| <= hi.
  std::pair<double, double> neighbours(double a) const {
    auto hi = std::lower_bound(table_.begin(), table_.end(), std::make_pair(a, 0u));
    if (hi->first == a) return {a, a};
    return {(hi - 1)->first, hi->first};
  }

  const std::vector<std::pair<double, uint32_t>>& table() const { return table_; }

 private:
  RefFormat f_;
  std::vector<std::pair<double, uint32_t>> table_;  // non-negative finite values, ascending
};

}  // namespace mp::testing
