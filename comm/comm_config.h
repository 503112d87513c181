// comm/comm_config.h: CommConfig (proto/mp.proto) to CommOptions, validated.
#pragma once

#include "comm/communicator.h"
#include "proto/mp.pb.h"

namespace mp {

// Throws ConfigError naming the field (as "comm.<field>") and what is wrong.
CommOptions comm_options_from_config(const proto::CommConfig& config);

// The configured hook name ("fp32" when unset).
std::string comm_hook_name(const proto::CommConfig& config);

}  // namespace mp
