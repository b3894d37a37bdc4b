// storage/run_queries: the desktop app's reads, against a real database file written by RunStore.
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "storage/run_queries.h"
#include "storage/run_store.h"
#include "tests/support/temp_dir.h"

namespace {

int64_t add_run(storage::RunStore& store, const std::string& name, const std::string& json) {
  storage::NewRun nr;
  nr.name = name;
  nr.model = "gpt/tiny";
  nr.config_json = json;
  return store.create_run(nr);
}

}  // namespace

TEST(RunQueries, IncrementalReadsInWriteOrderAndFigures) {
  testing_support::TempDir dir;
  const std::string db = dir.file("deltadeck.db");
  auto store = storage::RunStore::open(db);
  const int64_t a = add_run(*store, "a", R"({"train":{"lr":0.003}})");
  const int64_t b = add_run(*store, "b", R"({"train":{"lr":0.001}})");
  std::vector<storage::MetricRow> rows;
  for (int s = 1; s <= 10; ++s) {
    rows.push_back({a, {s, s * 100, s * 0.5, "loss", 5.0 - s * 0.1}});
    rows.push_back({b, {s, s * 100, s * 0.5, "loss", 9.0}});
  }
  rows.push_back({a, {5, 500, 2.5, "val_loss", 4.2}});
  rows.push_back({a, {10, 1000, 5.0, "val_loss", 3.9}});
  store->insert_metrics(rows);

  auto conn = storage::open_read_connection(db);
  const int64_t v0 = storage::data_version(conn.get());
  auto first = storage::metrics_after(conn.get(), a, 0, 7);
  ASSERT_EQ(first.size(), 7u);
  EXPECT_EQ(first[0].point.step, 1);
  for (size_t i = 1; i < first.size(); ++i) EXPECT_GT(first[i].rowid, first[i - 1].rowid);
  auto rest = storage::metrics_after(conn.get(), a, first.back().rowid, 1000);
  EXPECT_EQ(rest.size(), 5u);  // 10 loss + 2 val_loss rows of run a in all
  EXPECT_EQ(rest.back().point.key, "val_loss");
  EXPECT_TRUE(storage::metrics_after(conn.get(), a, rest.back().rowid, 1000).empty());

  // Another connection's commit moves data_version; the new row is the only one read.
  store->insert_metrics({{a, {11, 1100, 5.5, "loss", 3.0}}});
  EXPECT_NE(storage::data_version(conn.get()), v0);
  auto fresh = storage::metrics_after(conn.get(), a, rest.back().rowid, 1000);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0].point.step, 11);

  const storage::RunFigures f = storage::run_figures(conn.get(), a);
  EXPECT_EQ(f.last_step, 11);
  EXPECT_EQ(f.tokens, 1100);
  EXPECT_DOUBLE_EQ(f.wall_s, 5.5);
  EXPECT_TRUE(f.has_val);
  EXPECT_DOUBLE_EQ(f.best_val_loss, 3.9);
  EXPECT_FALSE(storage::run_figures(conn.get(), b).has_val);
  const auto configs = storage::run_configs(conn.get());
  ASSERT_EQ(configs.size(), 2u);
  EXPECT_EQ(configs[1].second, R"({"train":{"lr":0.001}})");
}

TEST(RunQueries, CsvExportReadsBackBitForBit) {
  testing_support::TempDir dir;
  const std::string db = dir.file("deltadeck.db");
  auto store = storage::RunStore::open(db);
  const int64_t a = add_run(*store, "a", "{}");
  const double tricky = 0.1 + 0.2;  // not representable in 15 digits
  store->insert_metrics({{a, {2, 200, 1.0 / 3.0, "loss", tricky}}, {a, {1, 100, 0.25, "loss", 1e-300}},
                         {a, {1, 100, 0.25, "lr", 3e-3}}, {a, {3, 300, 2.0, "loss", std::nan("")}}});
  auto conn = storage::open_read_connection(db);
  const std::string csv = dir.file("a.csv");
  EXPECT_EQ(storage::export_metrics_csv(conn.get(), a, csv), 4);
  std::ifstream in(csv);
  std::string header, l1, l2, l3, l4;
  std::getline(in, header);
  std::getline(in, l1);
  std::getline(in, l2);
  std::getline(in, l4);  // the NaN loss of step 3 (stored as NULL) comes back as nan, not 0
  std::getline(in, l3);
  EXPECT_EQ(l4, "3,300,2,loss,nan");
  EXPECT_EQ(header, "step,tokens,wall_s,key,value");
  EXPECT_EQ(l1.substr(0, 16), "1,100,0.25,loss,");
  EXPECT_EQ(std::stod(l1.substr(16)), 1e-300);
  EXPECT_EQ(l2.substr(0, 6), "2,200,");
  EXPECT_EQ(std::stod(l2.substr(l2.rfind(',') + 1)), tricky);
  EXPECT_EQ(l3, "1,100,0.25,lr,0.0030000000000000001");
  EXPECT_THROW(storage::export_metrics_csv(conn.get(), a, dir.file("no/such/dir/x.csv")), std::runtime_error);
  EXPECT_THROW(storage::open_read_connection(dir.file("missing.db")), std::runtime_error);
}
