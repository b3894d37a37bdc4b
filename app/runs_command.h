// `deltadeck runs ...`: the run database from the command line. Reading commands (list, show,
// compare, export) open it read-only, so they never block or change a database a training process
// is writing; editing commands (tag, note, rename, delete, import) open it read-write. A run is named by
// id, exact name or unique name prefix; a name that matches none or several is an error listing
// the candidates.
#pragma once

#include <string>
#include <vector>

namespace app {

struct RunsArgs {
  std::string runs_dir = "runs";   // --runs-dir: the folder of deltadeck.db
  std::string run;                 // the RUN of show, export, tag, note, rename
  std::vector<std::string> runs;   // the RUNs of compare and delete
  std::string status;              // list --status
  std::string tag;                 // list --tag
  std::string format = "csv";      // export --format csv | json
  std::string out = "-";           // export --out FILE ("-" = stdout)
  bool force = false;              // export --force: replace an existing FILE
  std::vector<std::string> tags;   // tag TAG...
  bool remove = false;             // tag --remove
  std::string text;                // note TEXT, rename NAME
  bool yes = false;                // delete --yes: do not ask
  std::vector<std::string> paths;  // import PATH...: run records, or run folders holding one
};

// Each returns the process exit code: 0 done, 1 no database / unknown run / failed, 2 bad arguments
// or (delete) not confirmed. Main thread.
int runs_list(const RunsArgs& a);
int runs_show(const RunsArgs& a);
int runs_compare(const RunsArgs& a);
int runs_export(const RunsArgs& a);
int runs_tag(const RunsArgs& a);
int runs_note(const RunsArgs& a);
int runs_rename(const RunsArgs& a);
int runs_delete(const RunsArgs& a);
// `runs import PATH...`: runs recorded elsewhere (a run_record.json, or a run folder holding one,
// e.g. a cluster job's run.checkpoint_dir/<run>) into this database, whole; creates the database
// if there is none. A name this database already has is refused.
int runs_import(const RunsArgs& a);

}  // namespace app
