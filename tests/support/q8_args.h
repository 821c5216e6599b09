#pragma once
// Q8Args for calling one int8 kernel table entry directly in the kernel
// tests (matmul_q8_test.cc, matmul_q8_wide_test.cc).

#include <cstdint>
#include <vector>

#include "model/backend/cpu/matmul_q8.h"
#include "model/backend/dtype.h"
#include "tests/support/test_weights.h"

namespace strata::testing {

// A kernel call over rows [row_begin, rows) of w and every token of act,
// into y (act.n_tokens x rows, row-major by token), from the file's layout
// (lanes unset). Wide activations (act.wide) fill the low plane's fields.
// w, act and y must outlive the call.
inline cpu::internal::Q8Args Q8ArgsFor(const TestWeight& w, const cpu::internal::Q8Activations& act,
                                       int64_t row_begin, std::vector<float>* y) {
  cpu::internal::Q8Args a;
  a.w = w.tensor.data;
  a.row_bytes = RowBytes(w.tensor.type, act.cols);
  a.cols = act.cols;
  a.row_begin = row_begin;
  a.row_end = w.tensor.rows();
  a.xq = act.q.data();
  a.xd = act.d.data();
  a.xbsum = act.bsum.data();
  if (act.wide) {
    a.xql = act.ql.data();
    a.xlbsum = act.lbsum.data();
  } else {
    a.xbsum16 = act.bsum16.data();
  }
  a.n_tokens = act.n_tokens;
  a.y = y->data();
  a.y_stride = w.tensor.rows();
  return a;
}

}  // namespace strata::testing
