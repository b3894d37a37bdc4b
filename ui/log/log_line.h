// Plain log lines of headless runs, in the style users know from torchtitan and llm.c. Pure
// functions over values, so the formats are tested without a run. The formats are an interface
// (scripts grep them): README "Output" documents them; extend them, do not reorder them.
//
// Text (`--log-format text`, the default when stdout is not a terminal), one line per record:
//   step 120/5000 | loss 3.4123 | aux 0.0660 | grad_norm 0.841 | scale 65536 | lr 2.90e-04 | 452k tok/s
//       | mfu 51.3% | mem 9.1 GiB | 1m12s | eta 1h12m                     (one line; see below)
//   eval step 200 | val_loss 2.0104 | val_ppl 7.47 | val_loss_ema 2.0003
//   checkpoint step 200 | runs/demo/checkpoints/step_00000200 | 1.3MB
//   skipped step 57 | 1 step skipped (non-finite gradients) by step 57, 3 in total; loss scale 65536 -> 32768
//   backoff step 57 | loss scale backed off 65536 -> 32768
//   info: paused at step 130                    (the engine's messages: info | warn | error)
// A step line always has `step S/N`, `loss` and the elapsed time; the other fields appear only when
// the run has them: aux (MoE), grad_norm, scale (loss scaling on, i.e. not 1), lr, tok/s, mfu (GPU
// runs or run.peak_tflops), mem (peak GPU memory), eta (once two steps were logged).
//
// JSON (`--log-format json`): one object per line, keys in a fixed order. Every line has "event"
// (step | eval | checkpoint | skipped | backoff | log | started | ended | run), "time" (UTC,
// ISO 8601), "run" (the run's name) and "step"; then
//   step, eval:  "total_steps", "tokens", "wall_s", "eta_s" (step; null until known) and every
//                metric of the step by its database key ("loss", "grad_norm", "lr", ...)
//   checkpoint:  "path", "bytes"        skipped: "text", "skipped_steps", "loss_scale"
//   backoff:     "text", "loss_scale"   log: "level", "text"
//   started:     "text", "params", "vocab_size"   ended: "status", "message"
// Non-finite numbers are written as null (JSON has no NaN).
#pragma once

#include <cstdint>
#include <string>

#include "trainer/api.h"
#include "ui/run_view.h"

namespace ui {

// "1h02m", "3m05s", "42s".
std::string format_duration(double seconds);
// "452k", "1.25M", "830".
std::string format_count(double v);
// 1234567 -> "1,234,567".
std::string format_grouped(int64_t v);
// 1536 -> "1.5 KiB" (B, KiB, MiB, GiB, TiB; one decimal).
std::string format_bytes(double b);
// One line for a metrics event: a training step as above (eta_s < 0: no eta field), or
// "eval step 200 | val_loss ... | val_ppl ...". Empty for events that are neither (telemetry).
std::string format_metrics_line(const trainer::MetricsEvent& m, int64_t total_steps, double eta_s = -1);
// The text line of a record; empty for records that have none (`ended`: the front end prints the
// run's final line once the database has recorded it).
std::string format_record_text(const LogRecord& r, int64_t total_steps);
// The JSON line of a record (no trailing newline). time_utc: the "time" value.
std::string format_record_json(const LogRecord& r, int64_t total_steps, const std::string& run_name,
                               const std::string& time_utc);
// The first JSON line of a run: {"event":"run","time":...,"run":...,"step":...,"id":...,"model":...,
// "params":...,"total_steps":...,"database":...,"resume_from":...,"config":{the resolved config}};
// "step" is where the run starts (0, or a resumed run's checkpoint step). config_json must be a JSON
// object (trainer::to_json); anything else gives "config": null.
std::string format_run_json(const RunView& v, const std::string& resume_from, const std::string& config_json,
                            const std::string& time_utc);

}  // namespace ui
