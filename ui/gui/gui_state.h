// Everything the desktop app's panels draw from and everything they ask for, as plain values:
// the loaded data (the live run's snapshot and history, past runs read from SQLite), the panels'
// own state (filters, selections, zoom), and the Actions a panel emits when the user asks for
// something that app/ must do (start a run, rename, delete, export, send a command).
// Panels never touch a thread, a file or the database: app/gui_* does, off the main thread where
// it could wait, and feeds the results back into this state.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "storage/types.h"
#include "trainer/api.h"
#include "ui/gui/markers.h"
#include "ui/gui/plot.h"
#include "ui/gui/run_filter.h"
#include "ui/gui/series.h"
#include "ui/gui/smoothing.h"
#include "ui/run_view.h"

namespace ui {

// ---- data

// A checkpoint file's checksum, checked on request against the sha256 recorded when it was saved.
enum class ChecksumState { Unchecked, Checking, Ok, Mismatch, Missing };

// A past (or other process's) run whose metrics the app has read from the database.
struct LoadedRun {
  int64_t id = 0;
  RunHistory history;
  // Bumped when the history is read again from the run's first row (the run was resumed: rows read
  // before were marked superseded); a read asked for under an older generation is dropped.
  uint64_t generation = 0;
  int64_t last_rowid = 0;       // metric rows read up to here
  bool loading = false;         // a read is on its way
  bool loaded_once = false;     // the first read finished (an empty history means: no metrics)
  std::vector<storage::CheckpointRecord> checkpoints;
  std::vector<storage::EventRecord> events;
  std::map<int64_t, ChecksumState> checksum;  // by checkpoint step
  std::string config_toml;
  std::map<std::string, SmoothedSeries> smoothed;  // by metric key
};

// The run this process trains, as the dashboard sees it.
struct LiveRun {
  bool active = false;          // a run host exists (running or ended but still shown)
  RunView view;                 // brought up to date from the host's snapshot every frame
  RunHistory history;           // the view's series, plus telemetry and per-rank keys from the database
  std::map<std::string, size_t> consumed;  // points of each RunView series already in `history`
  int64_t last_rowid = 0;       // database rows read for the keys RunView has no series of
  uint64_t seen_version = 0;
  uint64_t snapshots_taken = 0;
  uint64_t snapshots_skipped = 0;  // versions the UI never saw (it was busy): skipped, never waited for
  std::map<std::string, SmoothedSeries> smoothed;
  ChangeMarkers skipped, scale;  // skipped_steps rises, loss_scale falls (the loss-scale plot's markers)
};

// ---- actions (panel -> app)

namespace act {
struct LoadConfigFile { std::string path; };
struct SaveConfig { std::string path; };
struct StartRun {};                                    // the launcher's draft
struct SendCommand { trainer::Command command; };
struct ResumeRun { int64_t run_id = 0; int64_t step = -1; };  // from this checkpoint (-1: newest)
struct RenameRun { int64_t run_id = 0; std::string name; };
struct SetNote { int64_t run_id = 0; std::string note; };
struct AddTag { int64_t run_id = 0; std::string tag; };
struct RemoveTag { int64_t run_id = 0; std::string tag; };
struct DeleteRun { int64_t run_id = 0; };
struct ExportCsv { int64_t run_id = 0; std::string path; };
struct ExportCheckpoint { int64_t run_id = 0; int64_t step = 0; std::string dir; std::string out_dir; };
struct VerifyCheckpoint { int64_t run_id = 0; int64_t step = 0; std::string dir; std::string sha256; };
struct OpenRun { int64_t run_id = 0; };                // read its metrics and details
struct RefreshRuns {};
// `deltadeck train --resume RUN` in a new process of its own (its own session, output to a log
// file), for a run this process cannot continue (the GPU is blocked here) or should not.
struct ResumeInNewProcess { int64_t run_id = 0; };
struct StopAndClose {};                                // the close dialog's default
struct QuitNow {};                                     // leave at once, not waiting for the run to stop
}  // namespace act
using Action = std::variant<act::LoadConfigFile, act::SaveConfig, act::StartRun, act::SendCommand, act::ResumeRun,
                            act::RenameRun, act::SetNote, act::AddTag, act::RemoveTag, act::DeleteRun, act::ExportCsv,
                            act::ExportCheckpoint, act::VerifyCheckpoint, act::OpenRun, act::RefreshRuns,
                            act::ResumeInNewProcess, act::StopAndClose, act::QuitNow>;

// ---- panel state

// The launcher edits a draft RunConfig; Start copies it into a run (STYLE.md §6).
struct LauncherPanel {
  std::vector<std::string> presets;          // assets/configs/*.toml found at startup
  std::string source_name = "demo (embedded)";  // where the draft came from
  std::string open_path;                     // the path field of "Open"
  std::string save_path;                     // the path field of "Save as"
  trainer::RunConfig draft;
  std::string train_sources;                 // data.train, one source per line (edited as text)
  std::vector<std::string> parse_errors;     // from reading the file (unknown keys, bad TOML)
  std::vector<std::string> errors;           // validate(draft): "key: message"
  std::vector<std::string> start_errors;     // resolving for this machine (data files, devices)
  std::vector<std::string> devices;          // "cpu", "cuda:0 (NVIDIA H100 80GB HBM3, 79.1 GiB, sm_90)"
  std::string runs_dir;                      // fixed: the database the app shows
  std::string message;                       // the last save/load result
  std::vector<std::string> form_keys;        // the keys the form showed in its last frame
  bool dirty_validation = true;
};

struct DashboardPanel {
  XRange x;
  double smoothing = 0.6;                    // EMA weight; 0 = raw
  std::map<std::string, PlotState> plots;    // by plot title
  bool follow_log = true;                    // keep the event log scrolled to the newest line
  int64_t marker_step = -1;                  // the checkpoint marker clicked ("resume from here")
  bool confirm_stop = false;
};

struct RunsPanel {
  std::string filter_text;
  RunFilter filter;
  std::vector<SortKey> sort = {{RunColumn::Id, "", false}};
  std::vector<std::string> config_columns;   // config keys shown as extra columns
  std::string new_column;                    // the "add column" field
  std::vector<size_t> order;                 // rows shown, in order (filtered and sorted)
  uint64_t order_rows_version = ~0ull;       // rows version `order` was computed for
  bool order_dirty = true;
  std::set<int64_t> selected;                // run ids
  int64_t focused = 0;                       // the run whose details are shown
  std::string rename_buf, tag_buf, note_buf, csv_path, export_dir;
  int64_t note_for = 0;                      // run the note buffer was loaded for
  int64_t confirm_delete = 0;                // run id awaiting the delete confirmation
};

struct ComparePanel {
  std::vector<int64_t> runs;                 // in the order picked; colours follow this order
  XRange x;
  double smoothing = 0.6;
  std::vector<std::string> metrics = {"loss", "val_loss", "grad_norm", "lr", "tokens_per_s"};
  std::map<std::string, PlotState> plots;    // by metric
  std::string add_metric;
};

// What a resume found when it was refused, or passed over on its way (damaged or unfinished
// checkpoints): shown in a dialog until dismissed.
struct ResumeNotice {
  bool open = false;
  int64_t run_id = 0;
  std::string run_name;
  bool refused = false;                      // nothing was started
  std::string checkpoint;                    // the checkpoint chosen (or refused)
  std::vector<std::string> skipped;          // "<dir>: <why>" for each checkpoint passed over
  std::vector<std::string> mismatches;       // "model.d: the checkpoint has 64, this run has 128"
  std::string error;                         // any other reason it was refused
  bool gpu_blocked = false;                  // refused because this process may not use the GPU
};

// A `deltadeck train --resume` this app started as a process of its own.
struct ChildRun {
  int64_t run_id = 0;
  std::string run_name;
  int pid = 0;
  std::string command;                       // what it runs, as a shell line
  std::string log_path;                      // its output
  bool running = true;
  std::string outcome;                       // once it ended: "exited with status 0", "killed by signal 9"
};

// The window's close button (or a stop signal) while something is still going.
struct CloseState {
  bool requested = false;                    // the confirmation dialog is up
  bool closing = false;                      // confirmed: the run was asked to stop; close once it has
  double closing_since = -1;                 // ImGui::GetTime() when the closing dialog first showed
  bool quit_now = false;                     // a second close while stopping: leave at once
};

enum class Tab { Launch, Live, Runs, Compare };

struct GuiState {
  Tab tab = Tab::Launch;
  bool select_tab = true;                    // select `tab` on the next frame (programmatic switch)
  LauncherPanel launcher;
  DashboardPanel dashboard;
  RunsPanel runs;
  ComparePanel compare;

  LiveRun live;
  std::vector<RunRow> rows;                  // every run in the database
  uint64_t rows_version = 0;                 // bumped whenever rows change
  bool rows_loaded = false;
  std::string db_path;
  std::string db_status;                     // "no database yet", an error, or empty
  std::map<int64_t, LoadedRun> loaded;       // runs whose metrics were read

  std::string status;                        // the status bar: last action's outcome
  bool status_is_error = false;
  CloseState close;
  bool quit = false;                         // the app exits once nothing is left running
  size_t file_tasks = 0;                     // exports and checksums queued or running (set by app/)
  std::string launching;                     // a resume being prepared off the main thread ("" when none)
  ResumeNotice resume_notice;
  // Why this process may no longer run CUDA work (trainer::cuda_blocked_reason(), copied by app/
  // every frame); "" when it may.
  std::string cuda_blocked;
  std::string exe_path;                      // this program, for the resume command shown to the user
  std::vector<ChildRun> children;
  std::vector<Action> actions;               // emitted this frame; app drains them

  const RunRow* row(int64_t id) const {
    for (const auto& r : rows)
      if (r.id == id) return &r;
    return nullptr;
  }
  void set_status(std::string s, bool error = false) {
    status = std::move(s);
    status_is_error = error;
  }
};

}  // namespace ui
