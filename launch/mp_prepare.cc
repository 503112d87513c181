// launch/mp_prepare.cc: turns any file of text into byte-level tokens (one
// token per byte, ids 0..255) in llm.c's token file format
// (formats/token_file.h), so mp_worker can train on it:
//   build/mp_prepare input.txt train.bin [--val val.bin --val-fraction 0.1]
// With --val, the last val-fraction of the bytes go to the validation file.
// Exit codes: 0 success, 2 bad arguments or input, 1 I/O failure.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/token_file.h"

int main(int argc, char** argv) {
  CLI::App app{"mp_prepare: text -> byte-level tokens in llm.c's token file format"};
  std::string input, output, val_output;
  double val_fraction = 0.1;
  app.add_option("input", input, "Any file; every byte becomes one token")->required();
  app.add_option("output", output, "The training token file to write")->required();
  app.add_option("--val", val_output, "Also write a validation token file");
  app.add_option("--val-fraction", val_fraction, "With --val: the share of bytes, from the end, that go to it")
      ->check(CLI::Range(0.0, 0.5));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    std::ifstream in(input, std::ios::binary);
    if (!in) MP_THROW(mp::IoError, "input '", input, "': cannot open");
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.empty()) MP_THROW(mp::ConfigError, "input '", input, "' is empty: nothing to tokenize");
    std::vector<uint16_t> tokens(bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) tokens[i] = static_cast<unsigned char>(bytes[i]);
    size_t train = tokens.size();
    if (!val_output.empty()) {
      train = tokens.size() - static_cast<size_t>(val_fraction * static_cast<double>(tokens.size()));
      mp::write_token_file(val_output, std::vector<uint16_t>(tokens.begin() + static_cast<long>(train), tokens.end()));
      std::printf("%s: %zu tokens (validation)\n", val_output.c_str(), tokens.size() - train);
    }
    tokens.resize(train);
    mp::write_token_file(output, tokens);
    std::printf("%s: %zu tokens (byte-level, vocabulary 256)\n", output.c_str(), train);
    return 0;
  } catch (const mp::ConfigError& e) {
    std::fprintf(stderr, "mp_prepare: %s\n", e.message().c_str());
    return 2;
  } catch (const mp::Error& e) {
    std::fprintf(stderr, "mp_prepare: %s\n", e.message().c_str());
    return 1;
  }
}
