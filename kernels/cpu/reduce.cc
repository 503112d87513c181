#include "kernels/cpu/reduce.h"

#include "core/error.h"

namespace mp {

void accumulate_rank_chunks_cpu(const void* chunks, DType in, int n, int64_t stride, int64_t count,
                                void* out, DType out_dtype, math::ElementOp op, double divisor) {
  MP_ENFORCE(!is_fp8(in) && !is_fp8(out_dtype), "accumulation of ", dtype_name(in), " into ",
             dtype_name(out_dtype), " is not supported");
  dispatch_dtype(in, [&](auto in_tag) {
    dispatch_dtype(out_dtype, [&](auto out_tag) {
      using In = decltype(in_tag);
      using Out = decltype(out_tag);
      const In* c = static_cast<const In*>(chunks);
      Out* o = static_cast<Out*>(out);
      for (int64_t i = 0; i < count; ++i) math::accumulate_element(c, n, stride, i, o, op, divisor);
    });
  });
}

namespace {

template <class T, math::ElementOp kOp>
void reduce_pair_loop(const void* in, void* inout, int64_t n) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int64_t i = 0; i < n; ++i) math::reduce_pair_element(a, b, i, kOp);
}

}  // namespace

void reduce_pair_cpu(const void* in, void* inout, int64_t n, DType t, math::ElementOp op) {
  MP_ENFORCE(!is_fp8(t), "reductions on ", dtype_name(t), " are not supported");
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    switch (op) {  // the op as a template argument, so each loop vectorizes
      case math::ElementOp::kSum: return reduce_pair_loop<T, math::ElementOp::kSum>(in, inout, n);
      case math::ElementOp::kMax: return reduce_pair_loop<T, math::ElementOp::kMax>(in, inout, n);
      case math::ElementOp::kMin: return reduce_pair_loop<T, math::ElementOp::kMin>(in, inout, n);
    }
  });
}

}  // namespace mp
