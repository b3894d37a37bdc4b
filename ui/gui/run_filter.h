// The runs browser's rows and the logic behind its filter box and sortable columns. Pure
// functions, tested without GL.
//
// Filter language (terms separated by spaces, all must hold; case-insensitive):
//   word               name, model, status, tags or notes contain it
//   field:text         the field contains text      (name, status, model, tag, notes, or a config key)
//   field=text         the field equals text
//   field>N  field<N  field>=N  field<=N   numeric (params, steps, tokens, val, duration, id, world,
//                      or a numeric config key); N may end in k, M, G or B ("params>10M")
//   -term              the term must not hold
// Example: "gpt status:finished train.lr<1e-3 -tag:bad"
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ui/gui/config_diff.h"

namespace ui {

struct RunRow {
  int64_t id = 0;
  std::string name, status, model;
  int64_t params = 0;
  int64_t world_size = 1;
  int64_t steps = 0;            // last logged step
  int64_t tokens = 0;           // tokens seen at the last logged step
  double best_val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN: never evaluated
  double duration_s = 0;        // wall time of the last logged step
  std::string started_at;       // UTC ISO 8601 (sorts as text)
  std::string ended_at;
  std::string message;          // why it ended, when it did not finish
  std::vector<std::string> tags;
  std::string notes;
  FlatConfig config;            // flattened config_json
};

enum class RunColumn { Id, Name, Status, Model, Params, Steps, Tokens, BestVal, Duration, Started, Tags, Config };

struct SortKey {
  RunColumn column = RunColumn::Id;
  std::string config_key;       // for RunColumn::Config
  bool ascending = true;
};

struct FilterTerm {
  bool negate = false;
  std::string field;            // empty: a plain word
  std::string op;               // ":" "=" ">" "<" ">=" "<="
  std::string text;             // lower-cased
  double number = 0;            // for numeric ops
  bool numeric = false;
};
struct RunFilter {
  std::vector<FilterTerm> terms;
  std::vector<std::string> errors;  // terms that could not be read, e.g. "steps>abc: not a number"
};

RunFilter parse_filter(const std::string& text);
bool matches(const RunRow& row, const RunFilter& filter);
// Compares by the keys in order (ties fall to the next key, then to id). Rows missing a value
// (no validation loss, a config key an older run lacks) sort last in either direction.
bool run_less(const RunRow& a, const RunRow& b, const std::vector<SortKey>& keys);
// Indices of the rows that match, in sort order.
std::vector<size_t> filter_and_sort(const std::vector<RunRow>& rows, const RunFilter& filter,
                                    const std::vector<SortKey>& keys);
// "12k" → 12000, "1.5M", "3G"/"3B" → 3e9, "1e-3"; false when not a number.
bool parse_number(const std::string& s, double& out);

}  // namespace ui
