#include "launch/rank_main.h"

#include <iostream>
#include <memory>

#include "runtime/error.h"

namespace mp {

int run_rank_main(const char* program, int* argc, char*** argv,
                  const std::function<int(const MpiWorld&)>& body) {
  std::unique_ptr<MpiWorld> world;
  try {
    world = std::make_unique<MpiWorld>(argc, argv);
    return body(*world);
  } catch (const Error& e) {
    std::cerr << e.what() << std::endl;
    const int code = dynamic_cast<const ConfigError*>(&e) ? 2 : 1;
    if (world && world->size() > 1) world->abort(code);
    return code;
  } catch (const std::exception& e) {
    std::cerr << "[rank " << error_rank() << "] " << program << ": " << e.what() << std::endl;
    if (world && world->size() > 1) world->abort(1);
    return 1;
  }
}

}  // namespace mp
