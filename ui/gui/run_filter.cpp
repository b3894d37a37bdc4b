#include "ui/gui/run_filter.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace ui {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool contains(const std::string& hay, const std::string& needle_lower) {
  return lower(hay).find(needle_lower) != std::string::npos;
}

// A numeric field's value; false when the row has none.
bool numeric_field(const RunRow& r, const std::string& field, double& out) {
  if (field == "params") out = static_cast<double>(r.params);
  else if (field == "steps" || field == "step") out = static_cast<double>(r.steps);
  else if (field == "tokens") out = static_cast<double>(r.tokens);
  else if (field == "val" || field == "val_loss" || field == "best_val_loss") {
    if (std::isnan(r.best_val_loss)) return false;
    out = r.best_val_loss;
  } else if (field == "duration") out = r.duration_s;
  else if (field == "id") out = static_cast<double>(r.id);
  else if (field == "world" || field == "world_size" || field == "gpus") out = static_cast<double>(r.world_size);
  else {
    auto it = r.config.find(field);
    return it != r.config.end() && parse_number(it->second, out);
  }
  return true;
}

// Text values of a field (several for tags); false when the field is unknown to the row.
bool text_field(const RunRow& r, const std::string& field, std::vector<std::string>& out) {
  if (field == "name") out = {r.name};
  else if (field == "status") out = {r.status};
  else if (field == "model") out = {r.model};
  else if (field == "tag" || field == "tags") out = r.tags;
  else if (field == "notes" || field == "note") out = {r.notes};
  else if (field == "started") out = {r.started_at};
  else {
    auto it = r.config.find(field);
    if (it == r.config.end()) return false;
    out = {it->second};
  }
  return true;
}

bool term_holds(const RunRow& r, const FilterTerm& t) {
  if (t.field.empty()) {
    if (contains(r.name, t.text) || contains(r.model, t.text) || contains(r.status, t.text) || contains(r.notes, t.text))
      return true;
    for (const auto& tag : r.tags)
      if (contains(tag, t.text)) return true;
    return false;
  }
  if (t.numeric) {
    double v = 0;
    if (!numeric_field(r, t.field, v)) return false;
    if (t.op == ">") return v > t.number;
    if (t.op == "<") return v < t.number;
    if (t.op == ">=") return v >= t.number;
    if (t.op == "<=") return v <= t.number;
    return v == t.number;  // "=" with a number: numeric equality ("train.lr=3e-3" matches 0.003)
  }
  std::vector<std::string> values;
  if (!text_field(r, t.field, values)) return false;
  for (const auto& v : values) {
    if (t.op == ":" && contains(v, t.text)) return true;
    if (t.op == "=" && lower(v) == t.text) return true;
  }
  return false;
}

// Sort value of a column as a number (first) or text; `present` false when the row lacks it.
struct SortValue {
  bool present = true;
  bool is_number = false;
  double number = 0;
  std::string text;
};

SortValue sort_value(const RunRow& r, const SortKey& k) {
  SortValue v;
  auto num = [&](double x) {
    v.is_number = true;
    v.number = x;
  };
  switch (k.column) {
    case RunColumn::Id: num(static_cast<double>(r.id)); break;
    case RunColumn::Name: v.text = lower(r.name); break;
    case RunColumn::Status: v.text = r.status; break;
    case RunColumn::Model: v.text = r.model; break;
    case RunColumn::Params: num(static_cast<double>(r.params)); break;
    case RunColumn::Steps: num(static_cast<double>(r.steps)); break;
    case RunColumn::Tokens: num(static_cast<double>(r.tokens)); break;
    case RunColumn::BestVal:
      v.present = !std::isnan(r.best_val_loss);
      num(r.best_val_loss);
      break;
    case RunColumn::Duration: num(r.duration_s); break;
    case RunColumn::Started: v.text = r.started_at; break;
    case RunColumn::Tags: {
      std::string joined;
      for (const auto& t : r.tags) joined += lower(t) + ",";
      v.present = !r.tags.empty();
      v.text = joined;
      break;
    }
    case RunColumn::Config: {
      auto it = r.config.find(k.config_key);
      v.present = it != r.config.end();
      if (v.present) {
        double x = 0;
        if (parse_number(it->second, x)) num(x);
        else v.text = it->second;
      }
      break;
    }
  }
  return v;
}

}  // namespace

bool parse_number(const std::string& s, double& out) {
  if (s.empty()) return false;
  const char* b = s.c_str();
  char* e = nullptr;
  double v = std::strtod(b, &e);
  if (e == b) return false;
  std::string rest(e);
  if (rest == "k" || rest == "K") v *= 1e3;
  else if (rest == "m" || rest == "M") v *= 1e6;
  else if (rest == "g" || rest == "G" || rest == "b" || rest == "B") v *= 1e9;
  else if (!rest.empty()) return false;
  out = v;
  return true;
}

RunFilter parse_filter(const std::string& text) {
  RunFilter f;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    FilterTerm t;
    if (word.size() > 1 && word[0] == '-') {
      t.negate = true;
      word = word.substr(1);
    }
    // The first operator character splits field from value; ">=" and "<=" are two characters.
    const size_t at = word.find_first_of(":=<>");
    if (at == std::string::npos || at == 0) {
      t.text = lower(word);
      f.terms.push_back(t);
      continue;
    }
    t.field = lower(word.substr(0, at));
    size_t len = 1;
    if ((word[at] == '<' || word[at] == '>') && at + 1 < word.size() && word[at + 1] == '=') len = 2;
    t.op = word.substr(at, len);
    const std::string value = word.substr(at + len);
    t.text = lower(value);
    if (t.op != ":") {
      double n = 0;
      if (parse_number(value, n)) {
        t.numeric = true;
        t.number = n;
      } else if (t.op != "=") {
        f.errors.push_back(word + ": '" + value + "' is not a number");
        continue;
      }
    }
    f.terms.push_back(t);
  }
  return f;
}

bool matches(const RunRow& row, const RunFilter& filter) {
  for (const auto& t : filter.terms)
    if (term_holds(row, t) == t.negate) return false;
  return true;
}

bool run_less(const RunRow& a, const RunRow& b, const std::vector<SortKey>& keys) {
  for (const auto& k : keys) {
    const SortValue va = sort_value(a, k), vb = sort_value(b, k);
    if (va.present != vb.present) return va.present;  // missing values last, either direction
    if (!va.present) continue;
    if (va.is_number && vb.is_number) {
      if (va.number != vb.number) return k.ascending ? va.number < vb.number : va.number > vb.number;
    } else if (va.is_number != vb.is_number) {
      return va.is_number;  // numbers before text in a mixed config column
    } else if (va.text != vb.text) {
      return k.ascending ? va.text < vb.text : va.text > vb.text;
    }
  }
  return a.id < b.id;
}

std::vector<size_t> filter_and_sort(const std::vector<RunRow>& rows, const RunFilter& filter,
                                    const std::vector<SortKey>& keys) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < rows.size(); ++i)
    if (matches(rows[i], filter)) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return run_less(rows[a], rows[b], keys); });
  return idx;
}

}  // namespace ui
