#include "comm/mpi/tcp_defaults.h"

#include <cstdlib>

namespace mp {

std::vector<std::pair<std::string, std::string>> openmpi_tcp_defaults() {
  const std::string eager = std::to_string((size_t{1} << 20) + (size_t{64} << 10));
  return {{"btl_tcp_links", "2"},
          {"btl_tcp_eager_limit", eager},
          {"btl_tcp_rndv_eager_limit", eager},
          {"btl_tcp_max_send_size", eager}};
}

void apply_openmpi_tcp_defaults() {
  for (const auto& [name, value] : openmpi_tcp_defaults()) {
    ::setenv(("OMPI_MCA_" + name).c_str(), value.c_str(), /*overwrite=*/0);
  }
}

}  // namespace mp
