// Helpers shared by the `runs` subcommands (runs_command.cpp, runs_compare.cpp, runs_export.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "storage/run_store.h"

namespace app::runs {

// Opens <runs_dir>/deltadeck.db; prints why not and returns nullptr when it cannot. A read-only
// open of a database an older deltadeck wrote first migrates it once read-write (the changes are
// additive, so a run still training with the older program is unaffected).
std::unique_ptr<storage::RunStore> open_store(const std::string& runs_dir, bool read_only);
// find_run, printing the error (which lists the candidates) instead of throwing.
std::optional<storage::RunSummary> find(const storage::RunStore& store, const std::string& run);
// The runs named, in order, each once; nullopt after printing the first problem.
std::optional<std::vector<storage::RunSummary>> find_all(const storage::RunStore& store,
                                                         const std::vector<std::string>& names);

// printf-style formatting of one number.
std::string fmt(const char* f, double v);

// Figures of one run for show and compare.
struct Summary {
  bool has_loss = false, has_val = false;
  int64_t last_step = 0, tokens = 0;
  double wall_s = 0;
  double final_loss = 0, best_loss = 0;
  double final_val = 0, best_val = 0;
  int64_t best_val_step = 0;
  double median_tokens_per_s = -1, median_mfu = -1, peak_mem_gib = -1;
};
Summary summarize(const storage::RunStore& store, int64_t run_id);

}  // namespace app::runs
