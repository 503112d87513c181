#include "bench/bench.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>

#include "comm/gloo/gloo_communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/store.h"
#include "core/error.h"

namespace mp::bench {

int64_t parse_size_bytes(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string suffix = text.substr(digits);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = -1;
  if (suffix.empty() || suffix == "B") shift = 0;
  if (suffix == "K" || suffix == "KIB") shift = 10;
  if (suffix == "M" || suffix == "MIB") shift = 20;
  if (suffix == "G" || suffix == "GIB") shift = 30;
  if (digits == 0 || digits > 12 || shift < 0) {
    MP_THROW(ConfigError, "bad size '", text,
             "': want a positive number of bytes, optionally with K, M or G (binary multiples)");
  }
  const int64_t number = std::stoll(text.substr(0, digits));
  if (number <= 0 || number > (std::numeric_limits<int64_t>::max() >> shift)) {
    MP_THROW(ConfigError, "bad size '", text, "': must be positive and fit in 64 bits");
  }
  return number << shift;
}

std::string size_label(int64_t bytes) {
  constexpr int64_t kKiB = 1024;
  if (bytes >= (kKiB << 20) && bytes % (kKiB << 20) == 0) return std::to_string(bytes >> 30) + "G";
  if (bytes >= (kKiB << 10) && bytes % (kKiB << 10) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= kKiB && bytes % kKiB == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes) + "B";
}

void Reporter::emit(const nlohmann::ordered_json& fields) const {
  if (rank_ != 0) return;
  nlohmann::ordered_json line;
  line["suite"] = suite_;
  for (const auto& [key, value] : fields.items()) line[key] = value;
  // ", " and ": " separators, as in the contract's example; one line.
  std::string text = line.dump();
  std::string spaced;
  spaced.reserve(text.size() + text.size() / 4);
  bool in_string = false, escaped = false;
  for (const char c : text) {
    spaced += c;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == ',' || c == ':') {
      spaced += ' ';
    }
  }
  std::cout << spaced << std::endl;
}

void Reporter::note(const std::string& text) const {
  if (rank_ != 0 || json_only_) return;
  std::cout << "# " << text << std::endl;
}

double round_to(double v, int digits) {
  if (!std::isfinite(v)) return v;
  const double scale = std::pow(10.0, digits);
  return std::round(v * scale) / scale;
}

std::unique_ptr<Communicator> gloo_bench_world(const std::string& name) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char dir[256] = "/tmp/mp_bench_gloo.XXXXXX";
  if (rank == 0 && mkdtemp(dir) == nullptr) MP_THROW(IoError, "mkdtemp ", dir);
  MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
  auto world = GlooCommunicator::create_world(make_file_store(dir), rank, size, "127.0.0.1", name, CommOptions{});
  world->barrier()->wait();  // every rank has read the store
  if (rank == 0) std::filesystem::remove_all(dir);
  return world;
}

std::unique_ptr<Communicator> bench_world(const std::string& name) {
  const char* plane = std::getenv("MP_BENCH_DATA_PLANE");
  if (plane != nullptr && std::string(plane) == "gloo") return gloo_bench_world(name);
  return MpiCommunicator::create_world(name, CommOptions{});
}

}  // namespace mp::bench
