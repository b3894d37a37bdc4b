#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "ui/log/log_line.h"

TEST(LogLine, TrainStepFormat) {
  trainer::MetricsEvent m{120, 0, 72.4, {{"loss", 3.41234}, {"grad_norm", 0.8412}, {"lr", 2.9e-4}, {"tokens_per_s", 452300}}};
  EXPECT_EQ(ui::format_metrics_line(m, 5000),
            "step 120/5000 | loss 3.4123 | grad_norm 0.841 | lr 2.90e-04 | 452k tok/s | 1m12s");
}

TEST(LogLine, MoeAuxLossFollowsLoss) {
  trainer::MetricsEvent m{5, 0, 3, {{"loss", 2.5}, {"aux_loss", 0.06597}, {"grad_norm", 0.5}}};
  EXPECT_EQ(ui::format_metrics_line(m, 20), "step 5/20 | loss 2.5000 | aux 0.0660 | grad_norm 0.500 | 3s");
}

TEST(LogLine, ScaleAndEmaShownWhenInUse) {
  trainer::MetricsEvent step{7, 0, 2, {{"loss", 2.0}, {"lr", 1e-3}, {"loss_scale", 32768}}};
  EXPECT_EQ(ui::format_metrics_line(step, 10), "step 7/10 | loss 2.0000 | scale 32768 | lr 1.00e-03 | 2s");
  trainer::MetricsEvent off{7, 0, 2, {{"loss", 2.0}, {"loss_scale", 1.0}}};
  EXPECT_EQ(ui::format_metrics_line(off, 10), "step 7/10 | loss 2.0000 | 2s");
  trainer::MetricsEvent eval{10, 0, 3, {{"val_loss", 2.5}, {"val_ppl", 12.18}, {"val_loss_ema", 2.4}}};
  EXPECT_EQ(ui::format_metrics_line(eval, 10), "eval step 10 | val_loss 2.5000 | val_ppl 12.18 | val_loss_ema 2.4000");
}

TEST(LogLine, MfuAndPeakMemoryOnGpuRuns) {
  trainer::MetricsEvent m{120, 0, 72.4, {{"loss", 3.5}, {"tokens_per_s", 452300}, {"mfu", 0.5134}, {"mem_peak_gib", 9.06}}};
  EXPECT_EQ(ui::format_metrics_line(m, 5000), "step 120/5000 | loss 3.5000 | 452k tok/s | mfu 51.3% | mem 9.1 GiB | 1m12s");
}

TEST(LogLine, TelemetrySamplesMakeNoLine) {
  trainer::MetricsEvent m{120, 0, 72.4, {{"gpu0.util", 97}, {"gpu0.power_w", 650}}};
  EXPECT_EQ(ui::format_metrics_line(m, 5000), "");
}

TEST(LogLine, EvalFormat) {
  trainer::MetricsEvent m{200, 0, 10, {{"val_loss", 2.25}, {"val_ppl", 9.4877}}};
  EXPECT_EQ(ui::format_metrics_line(m, 5000), "eval step 200 | val_loss 2.2500 | val_ppl 9.49");
}

TEST(LogLine, Durations) {
  EXPECT_EQ(ui::format_duration(42.2), "42s");
  EXPECT_EQ(ui::format_duration(185), "3m05s");
  EXPECT_EQ(ui::format_duration(3725), "1h02m");
  EXPECT_EQ(ui::format_count(830), "830");
  EXPECT_EQ(ui::format_count(1260), "1.3k");
  EXPECT_EQ(ui::format_count(2.5e6), "2.50M");
}

// The issue's example line, field for field (plus the elapsed time the README documents).
TEST(LogLine, EveryFieldInItsPlace) {
  trainer::MetricsEvent m{120, 0, 72.4, {{"loss", 3.412}, {"grad_norm", 0.84}, {"lr", 2.9e-4}, {"tokens_per_s", 452300},
                                        {"loss_scale", 65536}, {"mfu", 0.513}, {"mem_peak_gib", 9.1},
                                        {"aux_loss", 0.01}, {"step_time_ms", 12}}};
  EXPECT_EQ(ui::format_metrics_line(m, 5000, 4320),
            "step 120/5000 | loss 3.4120 | aux 0.0100 | grad_norm 0.840 | scale 65536 | lr 2.90e-04 | 452k tok/s | "
            "mfu 51.3% | mem 9.1 GiB | 1m12s | eta 1h12m");
}

ui::LogRecord rec(const char* kind, int64_t step) {
  ui::LogRecord r;
  r.kind = kind;
  r.step = step;
  return r;
}

TEST(LogLine, RecordTextLines) {
  ui::LogRecord s = rec("step", 10);
  s.wall_s = 5;
  s.eta_s = 45;
  s.values = {{"loss", 2.5}};
  EXPECT_EQ(ui::format_record_text(s, 100), "step 10/100 | loss 2.5000 | 5s | eta 45s");
  ui::LogRecord c = rec("checkpoint", 20);
  c.path = "runs/x/checkpoints/step_00000020";
  c.values = {{"bytes", 1.3e6}};
  EXPECT_EQ(ui::format_record_text(c, 100), "checkpoint step 20 | runs/x/checkpoints/step_00000020 | 1.30MB");
  ui::LogRecord k = rec("skipped", 57);
  k.text = "1 step skipped (non-finite gradients) by step 57, 1 in total";
  EXPECT_EQ(ui::format_record_text(k, 100), "skipped step 57 | 1 step skipped (non-finite gradients) by step 57, 1 in total");
  ui::LogRecord b = rec("backoff", 58);
  b.text = "loss scale backed off 4 -> 2";
  EXPECT_EQ(ui::format_record_text(b, 100), "backoff step 58 | loss scale backed off 4 -> 2");
  ui::LogRecord l = rec("log", 3);
  l.level = "warn";
  l.text = "slow loader";
  EXPECT_EQ(ui::format_record_text(l, 100), "warn: slow loader");
  EXPECT_EQ(ui::format_record_text(rec("ended", 3), 100), "");
}

TEST(LogLine, JsonLinesParseAndCarryEveryMetric) {
  ui::LogRecord s = rec("step", 120);
  s.tokens = 61440;
  s.wall_s = 72.4;
  s.eta_s = -1;
  s.values = {{"loss", 3.41}, {"grad_norm", 0.84}, {"lr", 2.9e-4}, {"tokens_per_s", 452300}, {"loss_scale", 1},
              {"skipped_steps", 0}, {"data_wait_ms", 0.2}, {"mfu", std::nan("")}};
  const std::string line = ui::format_record_json(s, 5000, "demo", "2026-11-23T09:30:00Z");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["event"], "step");
  EXPECT_EQ(j["time"], "2026-11-23T09:30:00Z");
  EXPECT_EQ(j["run"], "demo");
  EXPECT_EQ(j["step"], 120);
  EXPECT_EQ(j["total_steps"], 5000);
  EXPECT_EQ(j["tokens"], 61440);
  EXPECT_TRUE(j["eta_s"].is_null());
  for (const auto& [k, v] : s.values) {
    ASSERT_TRUE(j.contains(k)) << k;
    if (std::isfinite(v)) {
      EXPECT_DOUBLE_EQ(j[k].get<double>(), v) << k;
    }
  }
  EXPECT_TRUE(j["mfu"].is_null());  // NaN has no JSON form
  // The fixed keys come first, in this order, so `head -c` and eyes find them.
  EXPECT_EQ(line.rfind("{\"event\":\"step\",\"time\":", 0), 0u) << line;

  ui::LogRecord c = rec("checkpoint", 20);
  c.path = "/r/step_00000020";
  c.values = {{"bytes", 4096}};
  const auto cj = nlohmann::json::parse(ui::format_record_json(c, 100, "demo", "t"));
  EXPECT_EQ(cj["path"], "/r/step_00000020");
  EXPECT_EQ(cj["bytes"], 4096);
  ui::LogRecord e = rec("ended", 100);
  e.status = "finished";
  e.text = "completed 100 steps";
  const auto ej = nlohmann::json::parse(ui::format_record_json(e, 100, "demo", "t"));
  EXPECT_EQ(ej["status"], "finished");
  EXPECT_EQ(ej["message"], "completed 100 steps");
  ui::LogRecord l = rec("log", 3);
  l.level = "error";
  l.text = "bad byte \xff here";  // invalid UTF-8 must not throw
  const auto lj = nlohmann::json::parse(ui::format_record_json(l, 100, "demo", "t"));
  EXPECT_EQ(lj["level"], "error");
}

TEST(LogLine, RunJsonLineHoldsTheConfig) {
  ui::RunView v;
  v.run_id = 4;
  v.run_name = "demo";
  v.model = "gpt/tiny";
  v.total_steps = 600;
  const auto j = nlohmann::json::parse(ui::format_run_json(v, "", R"({"train":{"lr":0.003}})", "t"));
  EXPECT_EQ(j["event"], "run");
  EXPECT_EQ(j["id"], 4);
  EXPECT_DOUBLE_EQ(j["config"]["train"]["lr"].get<double>(), 0.003);
  // A broken config text still gives a line that parses.
  EXPECT_TRUE(nlohmann::json::parse(ui::format_run_json(v, "", "{not json", "t"))["config"].is_null());
}

TEST(LogLine, GroupedDigitsAndBinaryBytes) {
  EXPECT_EQ(ui::format_grouped(0), "0");
  EXPECT_EQ(ui::format_grouped(999), "999");
  EXPECT_EQ(ui::format_grouped(1234567), "1,234,567");
  EXPECT_EQ(ui::format_grouped(-1000), "-1,000");
  EXPECT_EQ(ui::format_bytes(512), "512.0 B");
  EXPECT_EQ(ui::format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(ui::format_bytes(3.0 * (1 << 30)), "3.0 GiB");
}
