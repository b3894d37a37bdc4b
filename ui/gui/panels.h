// The desktop app's panels. Each draws from GuiState and its own panel struct and records what the
// user asked for in GuiState::actions; nothing here blocks, reads files or touches a thread.
// Main thread, between ImGui::NewFrame() and ImGui::Render().
#pragma once

#include "ui/gui/gui_state.h"

namespace ui {

// The whole window: menu, tabs, status bar, the close-during-a-run dialog.
void draw_main(GuiState& s);

void draw_launcher(GuiState& s);
void draw_dashboard(GuiState& s);
void draw_runs(GuiState& s);
void draw_compare(GuiState& s);

// Why a run with run.devices `run_devices` cannot be resumed in this window now ("" when it can):
// a run is training or being prepared here, or the run would need the GPU this process may no
// longer use (GuiState::cuda_blocked).
std::string resume_blocker(const GuiState& s, const std::string& run_devices);

// A run's checkpoints: step, size, validation loss, checksum; resume, export, verify.
// `history` gives the validation loss at each step (may be null); `no_resume` says why the resume
// buttons are off ("" when they are on; resume_blocker).
void draw_checkpoints(GuiState& s, int64_t run_id, const std::vector<storage::CheckpointRecord>& checkpoints,
                      const std::map<int64_t, ChecksumState>* checksum, const RunHistory* history,
                      const std::string& no_resume, std::string& export_dir);
// Per-rank step time and data wait of a multi-rank run (keys rank<r>.step_time_ms, rank<r>.data_wait_ms).
void draw_rank_view(const RunHistory& h, int64_t world_size);

}  // namespace ui
