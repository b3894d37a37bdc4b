#include "app/run_record.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "app/run_owner.h"
#include "storage/file_io.h"
#include "storage/file_util.h"

namespace app {

namespace {

using Json = nlohmann::ordered_json;

Json number(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

// Reads the record's fields, naming the source and the key path in every error.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  static std::string key_of(const std::string& parent, const char* name) {
    return parent.empty() ? std::string(name) : parent + "." + name;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw std::runtime_error(source_ + ": \"" + key + "\" " + why);
  }
  const nlohmann::ordered_json& member(const nlohmann::ordered_json& obj, const std::string& parent,
                                       const char* name) const {
    const std::string key = key_of(parent, name);
    if (!obj.is_object()) fail(parent, "must be an object");
    auto it = obj.find(name);
    if (it == obj.end()) fail(key, "is missing");
    return *it;
  }
  std::string text(const nlohmann::ordered_json& obj, const std::string& parent, const char* name) const {
    const auto& v = member(obj, parent, name);
    if (v.is_null()) return "";
    if (!v.is_string()) fail(key_of(parent, name), "must be a string or null");
    return v.get<std::string>();
  }
  int64_t integer(const nlohmann::ordered_json& v, const std::string& key) const {
    if (!v.is_number_integer()) fail(key, "must be an integer");
    return v.get<int64_t>();
  }
  int64_t integer(const nlohmann::ordered_json& obj, const std::string& parent, const char* name) const {
    return integer(member(obj, parent, name), key_of(parent, name));
  }
  // A number, or null for a value that was not finite (NaN here).
  double real(const nlohmann::ordered_json& v, const std::string& key) const {
    if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
    if (!v.is_number()) fail(key, "must be a number or null");
    return v.get<double>();
  }
  const nlohmann::ordered_json& array(const nlohmann::ordered_json& obj, const std::string& parent, const char* name) const {
    const auto& v = member(obj, parent, name);
    if (!v.is_array()) fail(key_of(parent, name), "must be an array");
    return v;
  }

 private:
  std::string source_;
};

}  // namespace

namespace {

// The document for run r with `metrics_fields` where its metrics belong: {"metrics": columns}
// inline, or {"metrics_file", "metric_rows"}.
Json record_doc(const storage::RunStore& store, const storage::RunSummary& r, const Json& metrics_fields) {
  Json doc;
  doc["run"] = {{"id", r.id},           {"name", r.name},         {"status", r.status},     {"message", r.message},
                {"model", r.model},     {"params", r.params},     {"world_size", r.world_size},
                {"host", r.host},       {"revision", r.revision}, {"started_at", r.started_at},
                {"heartbeat_at", r.heartbeat_at}, {"ended_at", r.ended_at}, {"last_step", r.last_step},
                {"tags", r.tags},       {"note", r.note}};
  doc["config"] = Json::parse(store.run_config_json(r.id), nullptr, /*allow_exceptions=*/false);
  if (doc["config"].is_discarded()) doc["config"] = nullptr;
  // The config as the run parses it (a resume reads the TOML), beside the JSON for other readers.
  doc["config_toml"] = store.run_config_toml(r.id);
  for (auto it = metrics_fields.begin(); it != metrics_fields.end(); ++it) doc[it.key()] = it.value();
  Json cks = Json::array();
  for (const auto& c : store.checkpoints(r.id)) {
    cks.push_back({{"step", c.step}, {"path", c.path}, {"bytes", c.bytes}, {"sha256", c.sha256},
                   {"created_at", c.created_at}});
  }
  doc["checkpoints"] = std::move(cks);
  Json events = Json::array();
  for (const auto& e : store.events(r.id)) {
    events.push_back({{"step", e.step}, {"level", e.level}, {"text", e.text}, {"created_at", e.created_at}});
  }
  doc["events"] = std::move(events);
  return doc;
}

std::string errno_text() { return std::strerror(errno); }

// The metrics file opened for writing (storage's FileIo has no appending open): whole writes,
// flushed to disk, closed; every failure throws naming it.
class OutFile {
 public:
  OutFile(const std::string& path, bool append) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd_ < 0) throw std::runtime_error(path + ": cannot open for writing (" + errno_text() + ")");
  }
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  void write(const std::string& text) {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error(path_ + ": write failed (" + errno_text() + ")");
      done += static_cast<size_t>(n);
    }
  }
  void sync_and_close() {
    if (::fsync(fd_) != 0) throw std::runtime_error(path_ + ": fsync failed (" + errno_text() + ")");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw std::runtime_error(path_ + ": close failed (" + errno_text() + ")");
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// Renames this process's temporary `tmp` over `path` and flushes the folder; removes tmp on failure.
void rename_over(const std::string& tmp, const std::string& path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + path + " (" + why + ")");
  }
  storage::files::fsync_path(storage::files::parent_dir(path));
}

// A temporary name of this process's own for `path`: the trainer and an edit (`runs note`) may
// write at once.
std::string temporary_for(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

// Writes `doc` to `path` whole or not at all.
void write_document(const Json& doc, const std::string& path) {
  const std::string text = doc.dump(1, ' ', false, Json::error_handler_t::replace) + "\n";
  const std::string tmp = temporary_for(path);
  try {
    storage::write_text_file(storage::posix_io(), tmp, text);
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    throw std::runtime_error(std::string("writing the run record: ") + e.what());
  }
  rename_over(tmp, path);
}

// The lines of `rows` in the metrics file: [key, step, tokens, wall_s, value] each, non-finite
// values as null. Written to `out` a megabyte at a time.
void write_metric_lines(OutFile& out, const std::vector<storage::MetricPoint>& rows, int64_t* bytes) {
  std::string text;
  for (const storage::MetricPoint& p : rows) {
    text += Json::array({p.key, p.step, p.tokens, number(p.wall_s), number(p.value)})
                .dump(-1, ' ', false, Json::error_handler_t::replace);
    text += '\n';
    if (text.size() >= (1u << 20)) {
      out.write(text);
      *bytes += static_cast<int64_t>(text.size());
      text.clear();
    }
  }
  out.write(text);
  *bytes += static_cast<int64_t>(text.size());
}

// The whole file at `f` as one JSON document; throws naming the file (and the byte where it is not JSON).
Json read_json_file(const std::string& f) {
  std::ifstream in(f, std::ios::binary);
  if (!in) throw std::runtime_error(f + ": cannot read (" + errno_text() + ")");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return Json::parse(text.str());
  } catch (const Json::parse_error& e) {
    throw std::runtime_error(f + ": not valid JSON at byte " + std::to_string(e.byte) +
                             " (a run record is one JSON document)");
  }
}

// The first `rows` lines of the metrics file `file` into out.metrics (and out.record.last_step).
void read_metrics_file(const std::string& file, int64_t rows, storage::ImportedRun& out) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(file + ": cannot read the run's metrics (" + errno_text() + ")");
  std::string line;
  for (int64_t i = 0; i < rows; ++i) {
    const std::string at = file + ": line " + std::to_string(i + 1);
    // A last line without its newline is an append cut short: not one of the run's rows.
    if (!std::getline(in, line) || in.eof()) {
      throw std::runtime_error(file + " holds " + std::to_string(i) + " whole lines; its record (" +
                               storage::RUN_RECORD_FILE + ") names " + std::to_string(rows) + " metric rows");
    }
    const Json row = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded()) throw std::runtime_error(at + " is not valid JSON");
    const auto real = [](const Json& v) { return v.is_null() || v.is_number(); };
    if (!row.is_array() || row.size() != 5 || !row[0].is_string() || !row[1].is_number_integer() ||
        !row[2].is_number_integer() || !real(row[3]) || !real(row[4])) {
      throw std::runtime_error(at + " must be [key, step, tokens, wall_s, value]");
    }
    storage::MetricPoint p;
    p.key = row[0].get<std::string>();
    p.step = row[1].get<int64_t>();
    p.tokens = row[2].get<int64_t>();
    p.wall_s = row[3].is_null() ? std::numeric_limits<double>::quiet_NaN() : row[3].get<double>();
    p.value = row[4].is_null() ? std::numeric_limits<double>::quiet_NaN() : row[4].get<double>();
    out.record.last_step = std::max(out.record.last_step, p.step);
    out.metrics.push_back(std::move(p));
  }
}

// Inline metrics ("metrics": columns step, tokens, wall_s and value for each key) into out.
void parse_inline_metrics(const Reader& in, const Json& metrics, storage::ImportedRun& out) {
  if (!metrics.is_object()) in.fail("metrics", "must be an object of metric columns");
  auto& r = out.record;
  for (auto it = metrics.begin(); it != metrics.end(); ++it) {
    const std::string key = "metrics." + it.key();
    const auto& steps = in.array(it.value(), key, "step");
    const auto& tokens = in.array(it.value(), key, "tokens");
    const auto& wall = in.array(it.value(), key, "wall_s");
    const auto& values = in.array(it.value(), key, "value");
    if (tokens.size() != steps.size() || wall.size() != steps.size() || values.size() != steps.size()) {
      in.fail(key, "has columns of different lengths (step " + std::to_string(steps.size()) + ", tokens " +
                       std::to_string(tokens.size()) + ", wall_s " + std::to_string(wall.size()) + ", value " +
                       std::to_string(values.size()) + ")");
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::string at = "[" + std::to_string(i) + "]";
      storage::MetricPoint p;
      p.key = it.key();
      p.step = in.integer(steps[i], key + ".step" + at);
      p.tokens = in.integer(tokens[i], key + ".tokens" + at);
      p.wall_s = in.real(wall[i], key + ".wall_s" + at);
      p.value = in.real(values[i], key + ".value" + at);
      r.last_step = std::max(r.last_step, p.step);
      out.metrics.push_back(std::move(p));
    }
  }
}

}  // namespace

nlohmann::ordered_json run_record_json(const storage::RunStore& store, const storage::RunSummary& r) {
  Json metrics = Json::object();
  for (const std::string& key : store.metric_keys(r.id)) {
    Json steps = Json::array(), tokens = Json::array(), wall = Json::array(), values = Json::array();
    for (const storage::MetricPoint& p : store.metrics(r.id, key)) {
      steps.push_back(p.step);
      tokens.push_back(p.tokens);
      wall.push_back(number(p.wall_s));
      values.push_back(number(p.value));
    }
    metrics[key] = {{"step", steps}, {"tokens", tokens}, {"wall_s", wall}, {"value", values}};
  }
  return record_doc(store, r, Json{{"metrics", std::move(metrics)}});
}

RunRecordWriter::RunRecordWriter(std::string run_dir) : dir_(std::move(run_dir)) {}

void RunRecordWriter::rewrite_metrics(const storage::RunStore& store, int64_t run_id) {
  // A name no record names yet: until the record is rewritten to name it, the record and the file
  // it names stay as they were (a resume's rewrite may hold fewer rows than the record names).
  const auto stamp = std::chrono::system_clock::now().time_since_epoch();
  const std::string name = std::string(storage::RUN_METRICS_PREFIX) + std::to_string(::getpid()) + "-" +
                           std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(stamp).count()) +
                           ".jsonl";
  const std::string path = dir_ + "/" + name;
  int64_t last_row = 0, bytes = 0;
  const auto rows = store.metrics_logged_after(run_id, 0, &last_row);
  try {
    OutFile out(path, /*append=*/false);
    write_metric_lines(out, rows, &bytes);
    out.sync_and_close();
    storage::files::fsync_path(dir_);  // the file's name on disk before a record names it
  } catch (const std::exception& e) {
    std::remove(path.c_str());
    throw std::runtime_error(std::string("writing the run's metrics: ") + e.what());
  }
  file_ = name;
  last_row_ = last_row;
  rows_ = static_cast<int64_t>(rows.size());
  bytes_ = bytes;
  in_step_ = true;
}

void RunRecordWriter::append_metrics(const storage::RunStore& store, int64_t run_id) {
  const std::string path = dir_ + "/" + file_;
  int64_t last_row = last_row_, bytes = 0;
  const auto rows = store.metrics_logged_after(run_id, last_row_, &last_row);
  if (rows.empty()) return;
  // Until the append is on disk the file is not known to be whole: a failure here leaves it to
  // the next write's rewrite.
  in_step_ = false;
  try {
    OutFile out(path, /*append=*/true);
    write_metric_lines(out, rows, &bytes);
    out.sync_and_close();
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("appending the run's metrics: ") + e.what());
  }
  last_row_ = last_row;
  rows_ += static_cast<int64_t>(rows.size());
  bytes_ += bytes;
  in_step_ = true;
}

void RunRecordWriter::write(const storage::RunStore& store, const storage::RunSummary& r) {
  // Another hand may have touched the file (or removed it); then it is written whole again.
  if (in_step_ && storage::files::file_size(dir_ + "/" + file_) != bytes_) in_step_ = false;
  const std::string before = file_;
  if (in_step_) append_metrics(store, r.id);
  else rewrite_metrics(store, r.id);
  write_document(record_doc(store, r, Json{{"metrics_file", file_}, {"metric_rows", rows_}}),
                 dir_ + "/" + storage::RUN_RECORD_FILE);
  // The record names the new file now: the metrics files it named before (this process's, or an
  // earlier job's) go.
  if (file_ == before) return;
  for (const std::string& f : storage::files::list_dir(dir_)) {
    if (f != file_ && f.rfind(storage::RUN_METRICS_PREFIX, 0) == 0) std::remove((dir_ + "/" + f).c_str());
  }
}

std::string refresh_run_record(const storage::RunStore& store, const storage::RunSummary& r, const std::string& run_dir) {
  const std::string path = run_dir + "/" + storage::RUN_RECORD_FILE;
  if (!storage::files::exists(path)) return "";
  // A process training the run rewrites the record at its next save, from its own database; a
  // rewrite from here could name a metrics file it has since replaced.
  if (const std::string busy = run_folder_busy(run_dir, /*wait=*/false, nullptr); !busy.empty())
    return "the run " + busy + ", which rewrites it at its next save";
  try {
    const Json there = read_json_file(path);
    const Reader in(path);
    const auto& run = in.member(there, "", "run");
    const std::string started_at = in.text(run, "run", "started_at");
    const int64_t last_step = in.integer(run, "run", "last_step");
    if (started_at != r.started_at) return path + " is another run's record (started " + started_at + "); left as it is";
    if (last_step > r.last_step) {
      return path + " is further along (step " + std::to_string(last_step) + " against " +
             std::to_string(r.last_step) + " here); left as it is";
    }
    // The metrics stay as the record has them: inline, or the file and how many of its lines.
    Json metrics_fields;
    if (there.contains("metrics")) {
      metrics_fields["metrics"] = there["metrics"];
    } else {
      metrics_fields["metrics_file"] = in.member(there, "", "metrics_file");
      metrics_fields["metric_rows"] = in.integer(there, "", "metric_rows");
    }
    write_document(record_doc(store, r, metrics_fields), path);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

storage::ImportedRun parse_run_record(const nlohmann::ordered_json& doc, const std::string& source,
                                      const std::string& metrics_dir) {
  const Reader in(source);
  storage::ImportedRun out;
  if (!doc.is_object()) in.fail("", "the document must be a JSON object (a run record)");
  const auto& run = in.member(doc, "", "run");
  auto& r = out.record;
  r.name = in.text(run, "run", "name");
  if (r.name.empty()) in.fail("run.name", "must not be empty");
  r.status = in.text(run, "run", "status");
  r.message = in.text(run, "run", "message");
  if (r.status == "running") {
    r.status = "interrupted";
    if (r.message.empty()) r.message = "imported while its record said running";
  }
  r.model = in.text(run, "run", "model");
  r.params = in.integer(run, "run", "params");
  r.world_size = in.integer(run, "run", "world_size");
  r.host = in.text(run, "run", "host");
  r.revision = in.text(run, "run", "revision");
  r.started_at = in.text(run, "run", "started_at");
  if (run.contains("heartbeat_at")) r.heartbeat_at = in.text(run, "run", "heartbeat_at");
  r.ended_at = in.text(run, "run", "ended_at");
  r.note = in.text(run, "run", "note");
  const auto& tags = in.array(run, "run", "tags");
  for (size_t i = 0; i < tags.size(); ++i) {
    if (!tags[i].is_string()) in.fail("run.tags[" + std::to_string(i) + "]", "must be a string");
    r.tags.push_back(tags[i].get<std::string>());
  }
  const auto& toml = in.member(doc, "", "config_toml");
  if (!toml.is_string() || toml.get<std::string>().empty())
    in.fail("config_toml", "must be the run's config as TOML (an export by an older deltadeck lacks it: export the "
                           "run again)");
  out.config_toml = toml.get<std::string>();
  const auto& config = in.member(doc, "", "config");
  // As the trainer writes it (trainer::to_json: fields in order, two spaces), so that a resume
  // comparing it with the config it runs sees no change where there is none.
  out.config_json = config.is_null() ? "" : config.dump(2);

  if (!doc.contains("metrics") && doc.contains("metrics_file")) {
    // The trainer's record: its metrics in the file beside it.
    const std::string name = in.text(doc, "", "metrics_file");
    if (name.empty() || name.find('/') != std::string::npos)
      in.fail("metrics_file", "must name a file in the record's folder");
    const int64_t rows = in.integer(doc, "", "metric_rows");
    if (rows < 0) in.fail("metric_rows", "must not be negative");
    read_metrics_file((metrics_dir.empty() ? std::string(".") : metrics_dir) + "/" + name, rows, out);
  } else {
    if (!doc.contains("metrics")) in.fail("metrics", "is missing (and so is metrics_file, which names a file of them)");
    parse_inline_metrics(in, doc["metrics"], out);
  }
  const auto& cks = in.array(doc, "", "checkpoints");
  for (size_t i = 0; i < cks.size(); ++i) {
    const std::string key = "checkpoints[" + std::to_string(i) + "]";
    storage::CheckpointRecord c;
    c.step = in.integer(cks[i], key, "step");
    c.path = in.text(cks[i], key, "path");
    if (c.path.empty()) in.fail(key + ".path", "must not be empty");
    c.bytes = in.integer(cks[i], key, "bytes");
    c.sha256 = in.text(cks[i], key, "sha256");
    c.created_at = in.text(cks[i], key, "created_at");
    out.checkpoints.push_back(std::move(c));
  }
  const auto& events = in.array(doc, "", "events");
  for (size_t i = 0; i < events.size(); ++i) {
    const std::string key = "events[" + std::to_string(i) + "]";
    storage::EventRecord e;
    e.step = in.integer(events[i], key, "step");
    e.level = in.text(events[i], key, "level");
    e.text = in.text(events[i], key, "text");
    e.created_at = in.text(events[i], key, "created_at");
    out.events.push_back(std::move(e));
  }
  return out;
}

storage::ImportedRun read_run_record(const std::string& path, std::string* file) {
  const std::string f = storage::files::is_dir(path) ? path + "/" + storage::RUN_RECORD_FILE : path;
  if (file) *file = f;
  if (!storage::files::exists(f)) {
    throw std::runtime_error(f + ": no such file" +
                             (storage::files::is_dir(path) ? std::string(" (the folder holds no run record)") : ""));
  }
  const Json doc = read_json_file(f);
  storage::ImportedRun run = parse_run_record(doc, f, storage::files::parent_dir(f));
  run.imported_from = storage::files::absolute_path(f);
  return run;
}

}  // namespace app
