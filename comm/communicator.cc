#include "comm/communicator.h"

#include "runtime/error.h"

namespace mp {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  MP_THROW(EnforceError, "invalid ReduceOp ", static_cast<int>(op));
}

}  // namespace mp
