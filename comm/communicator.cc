#include "comm/communicator.h"

#include "comm/backend_util.h"
#include "core/error.h"

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

namespace comm_detail {

math::ElementOp element_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return math::ElementOp::kSum;
    case ReduceOp::kMax: return math::ElementOp::kMax;
    case ReduceOp::kMin: return math::ElementOp::kMin;
  }
  MP_THROW(EnforceError, "invalid ReduceOp ", static_cast<int>(op));
}

double reduction_divisor(const ReduceOptions& o, int size) {
  MP_ENFORCE(o.divide_factor > 0, "divide_factor must be positive, got ", o.divide_factor);
  return (o.op == ReduceOp::kAvg ? size : 1) * o.divide_factor;
}

void check_reducible(DType t) {
  if (is_fp8(t)) MP_THROW(ConfigError, "reductions on ", dtype_name(t), " are not supported");
}

}  // namespace comm_detail
}  // namespace mp
