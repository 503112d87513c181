// core/strings.h: small string helpers the parsers share (MP_FAULT specs,
// --set overrides, the fuzz targets' inputs).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mp {

// The parts of `s` between separators: "a,,b" -> {"a", "", "b"}; "" -> {""}.
inline std::vector<std::string> split(std::string_view s, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(separator, start);
    parts.emplace_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

}  // namespace mp
