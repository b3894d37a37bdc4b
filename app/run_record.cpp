#include "app/run_record.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

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

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw std::runtime_error(source_ + ": \"" + key + "\" " + why);
  }
  const nlohmann::ordered_json& member(const nlohmann::ordered_json& obj, const std::string& parent,
                                       const char* name) const {
    const std::string key = parent.empty() ? name : parent + "." + name;
    if (!obj.is_object()) fail(parent, "must be an object");
    auto it = obj.find(name);
    if (it == obj.end()) fail(key, "is missing");
    return *it;
  }
  std::string text(const nlohmann::ordered_json& obj, const std::string& parent, const char* name) const {
    const auto& v = member(obj, parent, name);
    if (v.is_null()) return "";
    if (!v.is_string()) fail(parent + "." + name, "must be a string or null");
    return v.get<std::string>();
  }
  int64_t integer(const nlohmann::ordered_json& v, const std::string& key) const {
    if (!v.is_number_integer()) fail(key, "must be an integer");
    return v.get<int64_t>();
  }
  int64_t integer(const nlohmann::ordered_json& obj, const std::string& parent, const char* name) const {
    return integer(member(obj, parent, name), parent + "." + name);
  }
  // A number, or null for a value that was not finite (NaN here).
  double real(const nlohmann::ordered_json& v, const std::string& key) const {
    if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
    if (!v.is_number()) fail(key, "must be a number or null");
    return v.get<double>();
  }
  const nlohmann::ordered_json& array(const nlohmann::ordered_json& obj, const std::string& parent, const char* name) const {
    const auto& v = member(obj, parent, name);
    if (!v.is_array()) fail(parent.empty() ? name : parent + "." + name, "must be an array");
    return v;
  }

 private:
  std::string source_;
};

}  // namespace

nlohmann::ordered_json run_record_json(const storage::RunStore& store, const storage::RunSummary& r) {
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
  doc["metrics"] = std::move(metrics);
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

void write_run_record(const storage::RunStore& store, const storage::RunSummary& r, const std::string& path) {
  const std::string text = run_record_json(store, r).dump(1, ' ', false, Json::error_handler_t::replace) + "\n";
  // A name of this process's own: the trainer and an edit (`runs note`) may write at once.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    storage::write_text_file(storage::posix_io(), tmp, text);
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    throw std::runtime_error(std::string("writing the run record: ") + e.what());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error("writing the run record: cannot rename " + tmp + " to " + path + " (" + why + ")");
  }
  storage::files::fsync_path(storage::files::parent_dir(path));
}

std::string refresh_run_record(const storage::RunStore& store, const storage::RunSummary& r, const std::string& run_dir) {
  const std::string path = run_dir + "/" + storage::RUN_RECORD_FILE;
  if (!storage::files::exists(path)) return "";
  try {
    const storage::ImportedRun there = read_run_record(path);
    if (there.record.started_at != r.started_at)
      return path + " is another run's record (started " + there.record.started_at + "); left as it is";
    if (there.record.last_step > r.last_step) {
      return path + " is further along (step " + std::to_string(there.record.last_step) + " against " +
             std::to_string(r.last_step) + " here); left as it is";
    }
    write_run_record(store, r, path);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

storage::ImportedRun parse_run_record(const nlohmann::ordered_json& doc, const std::string& source) {
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

  const auto& metrics = in.member(doc, "", "metrics");
  if (!metrics.is_object()) in.fail("metrics", "must be an object of metric columns");
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
  std::ifstream in(f, std::ios::binary);
  if (!in) throw std::runtime_error(f + ": cannot read (" + std::strerror(errno) + ")");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(text.str());
  } catch (const nlohmann::ordered_json::parse_error& e) {
    throw std::runtime_error(f + ": not valid JSON at byte " + std::to_string(e.byte) +
                             " (a run record is one JSON document)");
  }
  storage::ImportedRun run = parse_run_record(doc, f);
  run.imported_from = storage::files::absolute_path(f);
  return run;
}

}  // namespace app
