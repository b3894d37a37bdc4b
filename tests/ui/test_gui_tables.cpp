// The runs browser's filter and sort, and the compare view's config diff.
#include <gtest/gtest.h>

#include <cmath>

#include "ui/gui/config_diff.h"
#include "ui/gui/run_filter.h"
#include "ui/gui/text_fit.h"

namespace {

std::vector<ui::RunRow> sample_rows() {
  std::vector<ui::RunRow> rows(4);
  rows[0].id = 1; rows[0].name = "demo"; rows[0].status = "finished"; rows[0].model = "gpt/tiny";
  rows[0].params = 1214208; rows[0].steps = 600; rows[0].best_val_loss = 2.01; rows[0].tags = {"baseline"};
  rows[0].config = {{"train.lr", "0.003"}, {"train.precision", "fp32"}};
  rows[1].id = 2; rows[1].name = "hybrid-a"; rows[1].status = "interrupted"; rows[1].model = "hybrid/small";
  rows[1].params = 52000000; rows[1].steps = 1200; rows[1].best_val_loss = 1.85; rows[1].notes = "node died";
  rows[1].config = {{"train.lr", "0.001"}, {"train.precision", "bf16"}};
  rows[2].id = 3; rows[2].name = "Demo-2"; rows[2].status = "running"; rows[2].model = "gpt/tiny";
  rows[2].params = 1214208; rows[2].steps = 40; rows[2].tags = {"lr-sweep", "bad"};
  rows[2].config = {{"train.lr", "0.01"}, {"train.precision", "fp32"}};
  rows[3].id = 4; rows[3].name = "old"; rows[3].status = "failed"; rows[3].model = "gpt/tiny";
  rows[3].params = 1214208; rows[3].steps = 7; rows[3].best_val_loss = 3.5;
  rows[3].config = {{"train.lr", "0.003"}};  // an older run without train.precision
  return rows;
}

std::vector<int64_t> ids(const std::vector<ui::RunRow>& rows, const std::vector<size_t>& idx) {
  std::vector<int64_t> out;
  for (size_t i : idx) out.push_back(rows[i].id);
  return out;
}

std::vector<int64_t> query(const std::string& q, std::vector<ui::SortKey> keys = {}) {
  const auto rows = sample_rows();
  const auto f = ui::parse_filter(q);
  EXPECT_TRUE(f.errors.empty()) << q;
  return ids(rows, ui::filter_and_sort(rows, f, keys));
}

}  // namespace

TEST(RunFilter, WordsFieldsNumbersAndNegation) {
  EXPECT_EQ(query(""), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(query("demo"), (std::vector<int64_t>{1, 3}));            // case-insensitive substring of the name
  EXPECT_EQ(query("status:interrupted"), (std::vector<int64_t>{2}));
  EXPECT_EQ(query("tag:lr"), (std::vector<int64_t>{3}));
  EXPECT_EQ(query("died"), (std::vector<int64_t>{2}));                // notes
  EXPECT_EQ(query("params>10M"), (std::vector<int64_t>{2}));
  EXPECT_EQ(query("train.lr<2e-3"), (std::vector<int64_t>{2}));       // a config key, numerically
  EXPECT_EQ(query("train.lr=3e-3"), (std::vector<int64_t>{1, 4}));    // 0.003 == 3e-3
  EXPECT_EQ(query("train.precision=fp32 -tag:bad"), (std::vector<int64_t>{1}));
  EXPECT_EQ(query("val<=2.01"), (std::vector<int64_t>{1, 2}));        // runs without validation never match
  EXPECT_EQ(query("gpt steps>=40"), (std::vector<int64_t>{1, 3}));
  const auto bad = ui::parse_filter("steps>many");
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_NE(bad.errors[0].find("steps>many"), std::string::npos);
}

TEST(RunFilter, SortsByColumnsWithMissingValuesLast) {
  using C = ui::RunColumn;
  EXPECT_EQ(query("", {{C::BestVal, "", true}}), (std::vector<int64_t>{2, 1, 4, 3}));
  EXPECT_EQ(query("", {{C::BestVal, "", false}}), (std::vector<int64_t>{4, 1, 2, 3}));
  EXPECT_EQ(query("", {{C::Name, "", true}}), (std::vector<int64_t>{1, 3, 2, 4}));  // case-insensitive
  EXPECT_EQ(query("", {{C::Config, "train.lr", false}}), (std::vector<int64_t>{3, 1, 4, 2}));
  EXPECT_EQ(query("", {{C::Config, "train.precision", true}}), (std::vector<int64_t>{2, 1, 3, 4}));
  // Ties fall to the next key: model, then steps descending.
  EXPECT_EQ(query("", {{C::Model, "", true}, {C::Steps, "", false}}), (std::vector<int64_t>{1, 3, 4, 2}));
}

TEST(ConfigDiff, OnlyKeysThatDiffer) {
  const std::string a = R"({"name":"a","model":{"family":"gpt","d":128},"train":{"lr":0.003,"phases":[]},"data":{"train":["text:x"]}})";
  const std::string b = R"({"name":"b","model":{"family":"gpt","d":256},"train":{"lr":0.003,"phases":[]},"data":{"train":["text:y"]}})";
  const std::string c = R"({"name":"c","model":{"family":"gpt","d":128},"train":{"lr":0.003},"data":{"train":["text:x"]}})";
  const ui::FlatConfig fa = ui::flatten_config_json(a);
  EXPECT_EQ(fa.at("model.d"), "128");
  EXPECT_EQ(fa.at("model.family"), "gpt");      // strings without their quotes
  EXPECT_EQ(fa.at("data.train"), "[\"text:x\"]");
  const auto diff = ui::config_diff({fa, ui::flatten_config_json(b), ui::flatten_config_json(c)});
  ASSERT_EQ(diff.size(), 3u);
  EXPECT_EQ(diff[0].key, "data.train");
  EXPECT_EQ(diff[1].key, "model.d");
  EXPECT_EQ(diff[1].values, (std::vector<std::string>{"128", "256", "128"}));
  EXPECT_EQ(diff[2].key, "train.phases");
  EXPECT_EQ(diff[2].values[2], ui::MISSING);
  EXPECT_TRUE(ui::config_diff({fa, fa}).empty());
  EXPECT_TRUE(ui::flatten_config_json("{not json").empty());
}

// A checkpoint's absolute path in a narrow column keeps its end: whole folder names where they fit,
// characters (never half of a UTF-8 one) where not even the last name fits.
TEST(FitPathTail, KeepsTheEndOfAPathThatDoesNotFit) {
  const auto bytes = [](const std::string& s) { return static_cast<float>(s.size()); };  // 1 a byte; "…" is 3
  const std::string p = "/home/me/project/runs/demo/checkpoints/step_00000040";
  EXPECT_EQ(ui::fit_path_tail(p, 200, bytes), p);
  EXPECT_EQ(ui::fit_path_tail(p, static_cast<float>(p.size()), bytes), p);
  EXPECT_EQ(ui::fit_path_tail(p, 40, bytes), "\xE2\x80\xA6/runs/demo/checkpoints/step_00000040");  // 38
  EXPECT_EQ(ui::fit_path_tail(p, 17, bytes), "\xE2\x80\xA6/step_00000040");
  EXPECT_EQ(ui::fit_path_tail(p, 10, bytes), "\xE2\x80\xA6" "0000040");
  EXPECT_EQ(ui::fit_path_tail(p, 2, bytes), "\xE2\x80\xA6");
  // "é" is two bytes: a cut lands before it or after it, not inside.
  EXPECT_EQ(ui::fit_path_tail("/r/caf\xC3\xA9", 6, bytes), "\xE2\x80\xA6" "f\xC3\xA9");
  EXPECT_EQ(ui::fit_path_tail("/r/caf\xC3\xA9", 5, bytes), "\xE2\x80\xA6" "\xC3\xA9");
  EXPECT_EQ(ui::fit_path_tail("/r/caf\xC3\xA9", 4, bytes), "\xE2\x80\xA6");
}
