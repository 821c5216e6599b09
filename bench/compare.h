#pragma once
// `strata bench compare A.json B.json ...`: the summaries of several
// `strata bench run` files side by side, each later column with its ratio to
// the first (B ÷ A), e.g. cache off against cache on.
//
// Thread-safety: pure functions.

#include <string>
#include <vector>

#include "common/status.h"

namespace strata::bench {

struct CompareRow {
  std::string metric;          // e.g. "ttft_s.p50"
  std::string unit;            // "ms", "req/s", "tok/s", "", "count"
  std::vector<double> values;  // one per file; NaN when a file lacks it
};

struct Comparison {
  std::vector<std::string> names;  // the files as given
  std::vector<CompareRow> rows;
};

// Reads the "summary" objects of run files (recomputing it from the records
// when absent). Errors: kNotFound / kIoError (a file), kInvalidArgument (not a
// run file), naming the file.
Result<Comparison> LoadComparison(const std::vector<std::string>& paths);

// The table: one row per metric, one column per file, then "B/A", "C/A" ...
// ratios printed with two decimals ("-" when the first value is 0 or either
// is missing).
std::string ComparisonTable(const Comparison& c);
// {"files": [...], "metrics": {name: {"unit", "values", "ratios"}}}.
std::string ComparisonJson(const Comparison& c);

}  // namespace strata::bench
