#include "kernels/sdpa_layout.h"

#include "core/error.h"

namespace mp {

std::string sdpa_shape_name(const SdpaShape& s) {
  return detail::str("(B=", s.batch, ", H=", s.heads, ", T=", s.seq, ", hs=", s.head_dim, ")");
}

SdpaLayout sdpa_layout(const SdpaShape& s) {
  MP_ENFORCE(s.batch > 0 && s.heads > 0 && s.seq > 0 && s.head_dim > 0, "attention shape ", sdpa_shape_name(s),
             ": every size must be positive");
  const int64_t c = s.channels();
  const std::array<int64_t, 4> dims{s.batch, s.heads, s.seq, s.head_dim};
  // A row of 3 C (qkv, dqkv) or C (out, dout) elements per token; head h
  // starts hs elements after head h - 1 in its row.
  const std::array<int64_t, 4> qkv_strides{s.seq * 3 * c, s.head_dim, 3 * c, 1};
  const std::array<int64_t, 4> out_strides{s.seq * c, s.head_dim, c, 1};
  SdpaLayout l;
  l.q = {dims, qkv_strides, 0};
  l.k = {dims, qkv_strides, c};
  l.v = {dims, qkv_strides, 2 * c};
  l.o = {dims, out_strides, 0};
  l.d_o = {dims, out_strides, 0};
  l.dq = l.q;
  l.dk = l.k;
  l.dv = l.v;
  l.stats = {{s.batch, s.heads, s.seq, 1}, {s.heads * s.seq, s.seq, 1, 1}, 0};
  return l;
}

}  // namespace mp
