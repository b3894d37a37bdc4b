// The run-config parser and validator: TOML text + "section.key=value" overrides -> RunConfig,
// reporting every problem at once, plus the TOML and JSON writers for the resolved config.
// One field table (fields()) drives extraction, unknown-key detection, to_toml and to_json, so a
// key added to api.h is one line here and the parse(to_toml(c)) round trip cannot drift. Overrides
// are merged into the TOML document before extraction rather than assigned to the struct, so a
// `--set` value passes through exactly the same type checks as the file.
#include "trainer/config.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "storage/run_name.h"

namespace trainer {
namespace {

// ---- the field table

using IntRef = int64_t& (*)(RunConfig&);
using UintRef = uint64_t& (*)(RunConfig&);
using FloatRef = double& (*)(RunConfig&);
using BoolRef = bool& (*)(RunConfig&);
using StringRef = std::string& (*)(RunConfig&);
using ListRef = std::vector<std::string>& (*)(RunConfig&);
using FamilyRef = model::Family& (*)(RunConfig&);
using NumListRef = std::vector<double>& (*)(RunConfig&);
// data.val: a fraction of documents (a number) or validation sources (a list of strings).
using ValRef = DataConfig& (*)(RunConfig&);
using Ref = std::variant<IntRef, UintRef, FloatRef, BoolRef, StringRef, ListRef, FamilyRef, NumListRef, ValRef>;

struct Field {
  const char* section;  // "" for the top level
  const char* key;      // the TOML key users write (ARCHITECTURE.md), not the C++ member name
  Ref ref;
};

// A captureless lambda per field, so one table can both read and write a nested member.
#define DD_CONFIG_FIELD(section, key, member) \
  Field { section, key, Ref{+[](RunConfig& c) -> decltype((c.member)) { return c.member; }} }

const std::vector<Field>& fields() {
  // Order is the order of to_toml / to_json output; model.family and model.preset come first
  // because extraction resolves the preset before applying the other [model] keys.
  static const std::vector<Field> all = {
      DD_CONFIG_FIELD("", "name", name),
      DD_CONFIG_FIELD("", "seed", seed),

      DD_CONFIG_FIELD("model", "family", model.family),
      DD_CONFIG_FIELD("model", "preset", model.preset),
      DD_CONFIG_FIELD("model", "vocab_size", model.vocab_size),
      DD_CONFIG_FIELD("model", "d", model.d),
      DD_CONFIG_FIELD("model", "L", model.n_layers),
      DD_CONFIG_FIELD("model", "pattern", model.pattern),
      DD_CONFIG_FIELD("model", "tie_embeddings", model.tie_embeddings),
      DD_CONFIG_FIELD("model", "norm_affine", model.norm_affine),
      DD_CONFIG_FIELD("model", "embed_norm", model.embed_norm),
      DD_CONFIG_FIELD("model", "logit_softcap", model.logit_softcap),
      DD_CONFIG_FIELD("model", "loss_chunk_tokens", model.loss_chunk_tokens),
      DD_CONFIG_FIELD("model", "rope_theta", model.rope_theta),
      DD_CONFIG_FIELD("model", "init_std", model.init_std),
      DD_CONFIG_FIELD("model", "max_seq_len", model.max_seq_len),
      DD_CONFIG_FIELD("model", "activation_checkpointing", model.activation_checkpointing),
      DD_CONFIG_FIELD("model", "attn_heads", model.attn_heads),
      DD_CONFIG_FIELD("model", "attn_kv_heads", model.attn_kv_heads),
      DD_CONFIG_FIELD("model", "attn_head_dim", model.attn_head_dim),
      DD_CONFIG_FIELD("model", "qk_norm", model.qk_norm),
      DD_CONFIG_FIELD("model", "gdn_heads", model.gdn_heads),
      DD_CONFIG_FIELD("model", "gdn_dk", model.gdn_dk),
      DD_CONFIG_FIELD("model", "gdn_dv", model.gdn_dv),
      DD_CONFIG_FIELD("model", "gdn_conv", model.gdn_conv),
      DD_CONFIG_FIELD("model", "gdn_chunk", model.gdn_chunk),
      DD_CONFIG_FIELD("model", "gdn_neg_eig", model.gdn_neg_eig),
      DD_CONFIG_FIELD("model", "gdn_scan_precision", model.gdn_scan_precision),
      DD_CONFIG_FIELD("model", "mla_heads", model.mla_heads),
      DD_CONFIG_FIELD("model", "mla_q_rank", model.mla_q_rank),
      DD_CONFIG_FIELD("model", "mla_kv_rank", model.mla_kv_rank),
      DD_CONFIG_FIELD("model", "mla_nope_dim", model.mla_nope_dim),
      DD_CONFIG_FIELD("model", "mla_rope_dim", model.mla_rope_dim),
      DD_CONFIG_FIELD("model", "mla_v_dim", model.mla_v_dim),
      DD_CONFIG_FIELD("model", "ffn_hidden", model.ffn_hidden),
      DD_CONFIG_FIELD("model", "moe_experts", model.moe_experts),
      DD_CONFIG_FIELD("model", "moe_top_k", model.moe_top_k),
      DD_CONFIG_FIELD("model", "moe_expert_hidden", model.moe_expert_hidden),
      DD_CONFIG_FIELD("model", "moe_shared_hidden", model.moe_shared_hidden),
      DD_CONFIG_FIELD("model", "moe_norm_topk", model.moe_norm_topk),
      DD_CONFIG_FIELD("model", "moe_aux_coef", model.moe_aux_coef),

      DD_CONFIG_FIELD("data", "train", data.train),
      DD_CONFIG_FIELD("data", "weights", data.weights),
      DD_CONFIG_FIELD("data", "exclude", data.exclude),
      DD_CONFIG_FIELD("data", "separator", data.separator),
      DD_CONFIG_FIELD("data", "text_field", data.text_field),
      DD_CONFIG_FIELD("data", "eot_token", data.eot_token),
      DD_CONFIG_FIELD("data", "tokenizer", data.tokenizer),
      DD_CONFIG_FIELD("data", "val", data),
      DD_CONFIG_FIELD("data", "document_attention", data.document_attention),
      DD_CONFIG_FIELD("data", "mask_boundary_labels", data.mask_boundary_labels),
      DD_CONFIG_FIELD("data", "loader_threads", data.loader_threads),
      DD_CONFIG_FIELD("data", "prefetch", data.prefetch),

      DD_CONFIG_FIELD("train", "steps", train.steps),
      DD_CONFIG_FIELD("train", "batch_size", train.batch_size),
      DD_CONFIG_FIELD("train", "seq_len", train.seq_len),
      DD_CONFIG_FIELD("train", "grad_accum", train.grad_accum),
      DD_CONFIG_FIELD("train", "phases", train.phases),
      DD_CONFIG_FIELD("train", "precision", train.precision),
      DD_CONFIG_FIELD("train", "optimizer", train.optimizer),
      DD_CONFIG_FIELD("train", "lr", train.lr),
      DD_CONFIG_FIELD("train", "lr_final_frac", train.lr_final_frac),
      DD_CONFIG_FIELD("train", "weight_decay", train.weight_decay),
      DD_CONFIG_FIELD("train", "beta1", train.beta1),
      DD_CONFIG_FIELD("train", "beta2", train.beta2),
      DD_CONFIG_FIELD("train", "eps", train.eps),
      DD_CONFIG_FIELD("train", "schedule", train.schedule),
      DD_CONFIG_FIELD("train", "warmup_steps", train.warmup_steps),
      DD_CONFIG_FIELD("train", "grad_clip", train.grad_clip),
      DD_CONFIG_FIELD("train", "ema_decay", train.ema_decay),
      DD_CONFIG_FIELD("train", "muon_lr", train.muon_lr),
      DD_CONFIG_FIELD("train", "muon_experts", train.muon_experts),
      DD_CONFIG_FIELD("train", "muon_precision", train.muon_precision),
      DD_CONFIG_FIELD("train", "loss_scaling", train.loss_scaling),
      DD_CONFIG_FIELD("train", "loss_scale_init", train.loss_scale_init),
      DD_CONFIG_FIELD("train", "loss_scale_growth_interval", train.loss_scale_growth_interval),
      DD_CONFIG_FIELD("train", "eval_batches", train.eval_batches),
      DD_CONFIG_FIELD("train", "mup_base_width", train.mup_base_width),
      DD_CONFIG_FIELD("train", "nonfinite", train.nonfinite),
      DD_CONFIG_FIELD("train", "max_nonfinite_steps", train.max_nonfinite_steps),
      DD_CONFIG_FIELD("train", "spike_zscore", train.spike_zscore),
      DD_CONFIG_FIELD("train", "spike_window", train.spike_window),
      DD_CONFIG_FIELD("train", "spike_action", train.spike_action),
      DD_CONFIG_FIELD("train", "cuda_graph", train.cuda_graph),
      DD_CONFIG_FIELD("train", "cuda_graph_pieces", train.cuda_graph_pieces),

      DD_CONFIG_FIELD("run", "devices", run.devices),
      DD_CONFIG_FIELD("run", "runs_dir", run.runs_dir),
      DD_CONFIG_FIELD("run", "checkpoint_dir", run.checkpoint_dir),
      DD_CONFIG_FIELD("run", "log_interval", run.log_interval),
      DD_CONFIG_FIELD("run", "eval_interval", run.eval_interval),
      DD_CONFIG_FIELD("run", "save_interval", run.save_interval),
      DD_CONFIG_FIELD("run", "keep_checkpoints", run.keep_checkpoints),
      DD_CONFIG_FIELD("run", "threads", run.threads),
      DD_CONFIG_FIELD("run", "peak_tflops", run.peak_tflops),
      DD_CONFIG_FIELD("run", "collective_timeout_s", run.collective_timeout_s),
      DD_CONFIG_FIELD("run", "bucket_mb", run.bucket_mb),
      DD_CONFIG_FIELD("run", "zero1", run.zero1),
      DD_CONFIG_FIELD("run", "save_retries", run.save_retries),
      DD_CONFIG_FIELD("run", "save_retry_delay_s", run.save_retry_delay_s),
  };
  return all;
}

#undef DD_CONFIG_FIELD

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = {"model", "data", "train", "run"};
  return names;
}

bool is_section(const std::string& name) {
  for (const std::string& s : section_names())
    if (s == name) return true;
  return false;
}

std::string full_key(const std::string& section, const std::string& key) {
  return section.empty() ? key : section + "." + key;
}

const Field* find_field(const std::string& section, const std::string& key) {
  for (const Field& f : fields())
    if (section == f.section && key == f.key) return &f;
  return nullptr;
}

// ---- formatting

// Shortest text that reads back to the same double, always with a '.' or exponent so TOML
// reads it as a float (TOML allows the leading zero in "1e-08").
std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// A TOML basic string (also valid JSON for ASCII text), used in output and in messages.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char esc[8];
          std::snprintf(esc, sizeof(esc), "\\u%04x", ch);
          out += esc;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

std::string render(const toml::node& n);

std::string render_array(const toml::array& a) {
  std::string out = "[";
  for (size_t i = 0; i < a.size(); ++i) {
    if (i) out += ", ";
    out += render(a[i]);
  }
  return out + "]";
}

std::string render(const toml::node& n) {
  if (auto v = n.as_string()) return quote(v->get());
  if (auto v = n.as_integer()) return std::to_string(v->get());
  if (auto v = n.as_floating_point()) return format_double(v->get());
  if (auto v = n.as_boolean()) return v->get() ? "true" : "false";
  if (auto v = n.as_array()) return render_array(*v);
  if (n.is_table()) return "{...}";
  std::ostringstream s;
  n.visit([&](auto&& v) { s << v; });
  return s.str();
}

// "string \"many\"": what a message shows after "got".
std::string describe(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string " + render(n);
    case toml::node_type::integer: return "integer " + render(n);
    case toml::node_type::floating_point: return "float " + render(n);
    case toml::node_type::boolean: return "boolean " + render(n);
    case toml::node_type::array: return "array " + render(n);
    case toml::node_type::table: return "a table";
    default: return "date/time " + render(n);
  }
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// ---- "did you mean"

size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest candidate, or "" when none is close: distance <= 3 (but not a full rewrite of a
// short word) or <= half the length. "lr_peak" is 5 edits from "lr", so a word-prefix match
// ("lr_peak" / "lr", "warmup" / "warmup_steps") also counts, as one edit.
std::string suggest(const std::string& unknown, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& cand : candidates) {
    size_t d = levenshtein(unknown, cand);
    bool word_prefix = starts_with(unknown, cand + "_") || starts_with(cand, unknown + "_");
    bool close = (d <= 3 && d < unknown.size()) || 2 * d <= unknown.size();
    if (word_prefix) d = std::min<size_t>(d, 1);
    if ((close || word_prefix) && d < best_d) {
      best = cand;
      best_d = d;
    }
  }
  return best;
}

std::string did_you_mean(const std::string& s) {
  return s.empty() ? "" : " (did you mean '" + s + "'?)";
}

// A key placed in the wrong section (`lr` at the top level, `devices` under [train]) is
// suggested at its real home first; otherwise the nearest key of the same section.
std::string suggest_key(const std::string& section, const std::string& key) {
  for (const Field& f : fields())
    if (section != f.section && key == f.key) return full_key(f.section, f.key);
  std::vector<std::string> same;
  for (const Field& f : fields())
    if (section == f.section) same.push_back(f.key);
  std::string s = suggest(key, same);
  return s.empty() ? "" : full_key(section, s);
}

// ---- extraction

struct Errors {
  std::vector<std::string> lines;
  std::set<std::string> keys;  // keys with a type error: validate() must not repeat them

  void add(const std::string& key, const std::string& what) {
    lines.push_back(key + ": " + what);
    keys.insert(key);
  }
};

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

std::string family_choices() {
  return std::string(model::family_name(model::Family::Gpt)) + ", " + model::family_name(model::Family::Hybrid);
}

// Reads one present node into its field, or records why not. Integers are accepted for floats
// (lr = 1 is 1.0); floats are never truncated into integers.
void read_field(const Field& f, const toml::node& n, RunConfig& c, Errors& e) {
  const std::string key = full_key(f.section, f.key);
  std::visit(
      Overloaded{
          [&](IntRef r) {
            if (auto v = n.as_integer()) r(c) = v->get();
            else e.add(key, "expected an integer, got " + describe(n));
          },
          [&](UintRef r) {
            auto v = n.as_integer();
            if (!v) e.add(key, "expected an integer, got " + describe(n));
            else if (v->get() < 0) e.add(key, "must be >= 0 (got " + std::to_string(v->get()) + ")");
            else r(c) = static_cast<uint64_t>(v->get());
          },
          [&](FloatRef r) {
            if (auto v = n.as_floating_point()) r(c) = v->get();
            else if (auto i = n.as_integer()) r(c) = static_cast<double>(i->get());
            else e.add(key, "expected a number, got " + describe(n));
          },
          [&](BoolRef r) {
            if (auto v = n.as_boolean()) r(c) = v->get();
            else e.add(key, "expected a boolean (true or false), got " + describe(n));
          },
          [&](StringRef r) {
            if (auto v = n.as_string()) r(c) = v->get();
            else e.add(key, "expected a string, got " + describe(n));
          },
          [&](ListRef r) {
            if (auto v = n.as_string()) {
              r(c) = {v->get()};
              return;
            }
            auto a = n.as_array();
            // toml++ calls an empty array not homogeneous; an empty list is still a list.
            if (!a || (!a->empty() && !a->is_homogeneous(toml::node_type::string))) {
              e.add(key, "expected a list of strings, got " + describe(n));
              return;
            }
            std::vector<std::string> out;
            for (const toml::node& item : *a) out.push_back(item.as_string()->get());
            r(c) = std::move(out);
          },
          [&](NumListRef r) {
            auto a = n.as_array();
            std::vector<double> out;
            bool ok = a != nullptr;
            if (a) {
              for (const toml::node& item : *a) {
                if (auto d = item.as_floating_point()) out.push_back(d->get());
                else if (auto i = item.as_integer()) out.push_back(static_cast<double>(i->get()));
                else ok = false;
              }
            }
            if (!ok) e.add(key, "expected a list of numbers, got " + describe(n));
            else r(c) = std::move(out);
          },
          [&](ValRef r) {
            DataConfig& d = r(c);
            if (auto v = n.as_floating_point()) {
              d.val_fraction = v->get();
              d.val_sources.clear();
            } else if (auto i = n.as_integer()) {
              d.val_fraction = static_cast<double>(i->get());
              d.val_sources.clear();
            } else if (auto str = n.as_string()) {
              d.val_sources = {str->get()};
              d.val_fraction = 0;
            } else if (auto a = n.as_array(); a && !a->empty() && a->is_homogeneous(toml::node_type::string)) {
              d.val_sources.clear();
              for (const toml::node& item : *a) d.val_sources.push_back(item.as_string()->get());
              d.val_fraction = 0;
            } else {
              e.add(key, "expected a fraction of documents (a number) or a list of sources, got " + describe(n));
            }
          },
          [&](FamilyRef r) {
            auto v = n.as_string();
            if (!v) {
              e.add(key, "expected a string, got " + describe(n));
            } else if (auto fam = model::family_from_name(v->get())) {
              r(c) = *fam;
            } else {
              e.add(key, "must be one of " + family_choices() + " (got " + quote(v->get()) + ")");
            }
          },
      },
      f.ref);
}

const toml::node* lookup(const toml::table& doc, const std::string& section, const std::string& key) {
  if (section.empty()) return doc.get(key);
  const toml::table* t = doc.get_as<toml::table>(section);
  return t ? t->get(key) : nullptr;
}

void check_unknown_keys(const toml::table& doc, Errors& e) {
  for (auto&& [k, node] : doc) {
    const std::string key(k.str());
    if (is_section(key)) {
      if (!node.is_table()) e.add(key, "expected a table ([" + key + "]), got " + describe(node));
      continue;
    }
    if (find_field("", key)) continue;
    if (node.is_table())
      e.add(key, "unknown section" + did_you_mean(suggest(key, section_names())));
    else
      e.add(key, "unknown key" + did_you_mean(suggest_key("", key)));
  }
  for (const std::string& section : section_names()) {
    const toml::table* t = doc.get_as<toml::table>(section);
    if (!t) continue;
    for (auto&& [k, node] : *t) {
      const std::string key(k.str());
      if (!find_field(section, key))
        e.add(full_key(section, key), "unknown key" + did_you_mean(suggest_key(section, key)));
    }
  }
}

void extract(const toml::table& doc, RunConfig& c, Errors& e) {
  check_unknown_keys(doc, e);

  // The preset is the base the other [model] keys override, so it is resolved first.
  const Field* family = find_field("model", "family");
  const Field* preset = find_field("model", "preset");
  c.model.family = model::Family::Gpt;
  c.model.preset = "tiny";
  for (const Field* f : {family, preset})
    if (const toml::node* n = lookup(doc, f->section, f->key)) read_field(*f, *n, c, e);
  std::optional<model::ModelConfig> base = model::make_preset(c.model.preset, c.model.family);
  if (!base) {
    e.add("model.preset", "must be one of " + join(model::preset_names(), ", ") + " (got " +
                              quote(c.model.preset) + ")");
    // Keep checking the other keys against a valid base rather than stopping here.
    base = model::make_preset("tiny", c.model.family);
  }
  if (base) c.model = *base;

  for (const Field& f : fields()) {
    if (&f == family || &f == preset) continue;
    if (const toml::node* n = lookup(doc, f.section, f.key)) read_field(f, *n, c, e);
  }
  if (!lookup(doc, "model", "max_seq_len")) c.model.max_seq_len = c.train.seq_len;
}

// ---- overrides

// `text` as one TOML value, or nullopt when it is not exactly one (then it is a bare string).
std::optional<toml::table> parse_value(const std::string& text) {
  try {
    toml::table t = toml::parse("v = " + text);
    if (t.size() == 1 && t.contains("v")) return t;
  } catch (const toml::parse_error&) {
  }
  return std::nullopt;
}

// Whether text is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF): a TOML
// file is checked by its parser, an override's raw text only here.
bool valid_utf8(const std::string& text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

void apply_override(toml::table& doc, const std::string& override_text, Errors& e) {
  const std::string bad = "override " + quote(override_text) + ": expected section.key=value (e.g. train.lr=1e-3)";
  size_t eq = override_text.find('=');
  if (eq == std::string::npos) {
    e.lines.push_back(bad);
    return;
  }
  const std::string key = trim(override_text.substr(0, eq));
  const std::string text = trim(override_text.substr(eq + 1));
  std::string section, name = key;
  size_t dot = key.find('.');
  if (dot != std::string::npos) {
    section = key.substr(0, dot);
    name = key.substr(dot + 1);
  }
  if (name.empty() || (dot != std::string::npos && section.empty())) {
    e.lines.push_back(bad);
    return;
  }

  toml::table* target = &doc;
  if (!section.empty()) {
    if (!doc.contains(section)) doc.insert(section, toml::table{});
    target = doc.get_as<toml::table>(section);
    if (!target) {
      e.lines.push_back("override " + quote(override_text) + ": " + quote(section) +
                        " holds a value, not a section, so it has no key " + quote(name));
      return;
    }
  } else if (doc.get_as<toml::table>(name) || is_section(name)) {
    // `model={d=256}` would replace the whole [model] section, its other keys going back to their
    // defaults without a word.
    e.lines.push_back("override " + quote(override_text) + ": would replace the whole [" + name +
                      "] section; set its keys one at a time (e.g. " + name + ".KEY=VALUE)");
    return;
  }

  // `run.devices=0` or `name=123` mean the text itself: for keys that hold strings, a value
  // that parses as a non-string scalar is taken verbatim instead of failing the type check.
  const Field* f = find_field(section, name);
  const bool wants_string = f && !std::holds_alternative<IntRef>(f->ref) &&
                            !std::holds_alternative<UintRef>(f->ref) &&
                            !std::holds_alternative<FloatRef>(f->ref) &&
                            !std::holds_alternative<BoolRef>(f->ref) &&
                            !std::holds_alternative<NumListRef>(f->ref) && !std::holds_alternative<ValRef>(f->ref);
  const bool wants_list = f && std::holds_alternative<ListRef>(f->ref);
  std::optional<toml::table> parsed = parse_value(text);
  toml::node* value = parsed ? parsed->get("v") : nullptr;
  if (!value || (wants_string && !value->is_string() && !(wants_list && value->is_array()))) {
    if (!valid_utf8(text)) {
      e.lines.push_back("override " + quote(override_text) + ": the value is not valid UTF-8 text");
      return;
    }
    target->insert_or_assign(name, text);
    return;
  }
  value->visit([&](auto& v) { target->insert_or_assign(name, std::move(v)); });
}

// ---- validation helpers

struct Checker {
  std::vector<std::string> out;

  void fail(const std::string& key, const std::string& what) { out.push_back(key + ": " + what); }

  void at_least(const std::string& key, int64_t v, int64_t lo) {
    if (v < lo) fail(key, "must be >= " + std::to_string(lo) + " (got " + std::to_string(v) + ")");
  }
  void in_range(const std::string& key, int64_t v, int64_t lo, int64_t hi, const std::string& why = "") {
    if (v < lo || v > hi)
      fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]" + why + " (got " +
                    std::to_string(v) + ")");
  }
  // The float checks are written so that nan and inf fail them.
  void positive(const std::string& key, double v) {
    if (!(std::isfinite(v) && v > 0)) fail(key, "must be > 0 (got " + format_double(v) + ")");
  }
  void non_negative(const std::string& key, double v) {
    if (!(std::isfinite(v) && v >= 0)) fail(key, "must be >= 0 (got " + format_double(v) + ")");
  }
  void unit_open(const std::string& key, double v) {
    if (!(v >= 0 && v < 1)) fail(key, "must be in [0, 1) (got " + format_double(v) + ")");
  }
  void unit_closed(const std::string& key, double v) {
    if (!(v >= 0 && v <= 1)) fail(key, "must be in [0, 1] (got " + format_double(v) + ")");
  }
  void one_of(const std::string& key, const std::string& v, const std::vector<std::string>& allowed) {
    for (const std::string& a : allowed)
      if (v == a) return;
    fail(key, "must be one of " + join(allowed, ", ") + " (got " + quote(v) + ")");
  }
};

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;
  for (char ch : s)
    if (ch < '0' || ch > '9') return false;
  return true;
}

// The most CPU ranks run.devices = "cpu:N" takes.
constexpr int64_t kMaxCpuRanks = 256;

void check_devices(Checker& k, const std::string& devices) {
  const std::string allowed = "must be auto, cpu, cpu:N, all or a list of GPU ids like \"0,1\" (got " +
                              quote(devices) + ")";
  if (devices == "auto" || devices == "cpu" || devices == "all") return;
  if (starts_with(devices, "cpu:")) {
    std::string n = devices.substr(4);
    if (!all_digits(n) || std::stoll(n) < 1) k.fail("run.devices", allowed);
    // One thread and one Gloo process-group member a rank: past a few hundred, a thread that cannot
    // start would end the process.
    else if (std::stoll(n) > kMaxCpuRanks)
      k.fail("run.devices",
             "cpu:N takes at most " + std::to_string(kMaxCpuRanks) + " ranks (got " + quote(devices) + ")");
    return;
  }
  std::set<int64_t> seen;
  std::stringstream ss(devices);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    if (!all_digits(item)) {
      k.fail("run.devices", allowed);
      return;
    }
    if (!seen.insert(std::stoll(item)).second) {
      k.fail("run.devices", "GPU " + item + " is listed twice (got " + quote(devices) + ")");
      return;
    }
  }
  if (seen.empty() || devices.back() == ',') k.fail("run.devices", allowed);
}

// One field's value in TOML syntax, as to_toml writes it.
std::string toml_value(const Field& f, RunConfig& c) {
  return std::visit(
      Overloaded{
          [&](IntRef r) { return std::to_string(r(c)); },
          [&](UintRef r) { return std::to_string(r(c)); },
          [&](FloatRef r) { return format_double(r(c)); },
          [&](BoolRef r) { return std::string(r(c) ? "true" : "false"); },
          [&](StringRef r) { return quote(r(c)); },
          [&](ListRef r) {
            std::vector<std::string> q;
            for (const std::string& s : r(c)) q.push_back(quote(s));
            return "[" + join(q, ", ") + "]";
          },
          [&](FamilyRef r) { return quote(model::family_name(r(c))); },
          [&](NumListRef r) {
            std::vector<std::string> q;
            for (double v : r(c)) q.push_back(format_double(v));
            return "[" + join(q, ", ") + "]";
          },
          [&](ValRef r) {
            const DataConfig& d = r(c);
            if (d.val_sources.empty()) return format_double(d.val_fraction);
            std::vector<std::string> q;
            for (const std::string& s : d.val_sources) q.push_back(quote(s));
            return "[" + join(q, ", ") + "]";
          },
      },
      f.ref);
}

}  // namespace

// ---- public API

std::string run_folder(const RunConfig& c, const std::string& name) {
  return (c.run.checkpoint_dir.empty() ? c.run.runs_dir : c.run.checkpoint_dir) + "/" + name;
}

std::vector<std::string> validate(const RunConfig& c) {
  Checker k;
  // The run's folder under runs_dir is named after it.
  if (const std::string why = storage::run_name_problem(c.name); !why.empty())
    k.fail("name", why + " (got " + quote(c.name) + ")");
  // TOML integers are signed 64-bit, so a larger seed could not be written back by to_toml.
  if (c.seed > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    k.fail("seed", "must be < 2^63 (got " + std::to_string(c.seed) + ")");

  k.one_of("model.preset", c.model.preset, model::preset_names());
  // vocab_size 0 means "from the tokenizer" and is filled in when the run starts, so the
  // model's own ">= 1" check sees a stand-in and the range is reported here instead.
  model::ModelConfig m = c.model;
  if (m.vocab_size < 0)
    k.fail("model.vocab_size", "must be >= 0, 0 = from the tokenizer (got " + std::to_string(m.vocab_size) + ")");
  if (m.vocab_size <= 0) m.vocab_size = 1;
  for (const std::string& line : model::validate(m)) k.out.push_back(line);
  if (c.model.max_seq_len >= 1 && c.train.seq_len >= 1 && c.model.max_seq_len < c.train.seq_len)
    k.fail("model.max_seq_len", "must be >= train.seq_len (got " + std::to_string(c.model.max_seq_len) +
                                    " < " + std::to_string(c.train.seq_len) + ")");

  if (c.data.train.empty()) k.fail("data.train", "required (a list of sources like \"text:/path/*.txt\")");
  static const std::vector<std::string> kinds = {"text:", "jsonl:", "llmc:", "u16:", "random:"};
  for (const std::string& src : c.data.train) {
    std::string kind;
    for (const std::string& p : kinds)
      if (starts_with(src, p)) kind = p;
    if (kind.empty())
      k.fail("data.train", "each source must start with one of text:, jsonl:, llmc:, u16:, random: (got " + quote(src) + ")");
    else if (trim(src.substr(kind.size())).empty())
      k.fail("data.train", "a source needs a path after " + quote(kind) + " (got " + quote(src) + ")");
  }
  k.at_least("data.eot_token", c.data.eot_token, 0);
  if (c.data.tokenizer != "byte" &&
      !(starts_with(c.data.tokenizer, "sentencepiece:") && c.data.tokenizer.size() > 14))
    k.fail("data.tokenizer", "must be \"byte\" or \"sentencepiece:PATH\" (got " + quote(c.data.tokenizer) + ")");
  if (c.data.val_sources.empty()) {
    k.unit_open("data.val", c.data.val_fraction);
  } else {
    for (const std::string& src : c.data.val_sources) {
      bool known = false;
      for (const std::string& p : kinds) known = known || (starts_with(src, p) && !trim(src.substr(p.size())).empty());
      if (!known)
        k.fail("data.val", "each validation source must be text:, jsonl:, llmc: or u16: with a path (got " + quote(src) + ")");
    }
  }
  if (!c.data.weights.empty()) {
    if (c.data.weights.size() != c.data.train.size())
      k.fail("data.weights", "needs one weight per data.train source (got " + std::to_string(c.data.weights.size()) +
                                 " weights for " + std::to_string(c.data.train.size()) + " sources)");
    for (double w : c.data.weights)
      if (!(std::isfinite(w) && w > 0)) k.fail("data.weights", "every weight must be > 0 (got " + format_double(w) + ")");
  }
  if (c.data.text_field.empty()) k.fail("data.text_field", "must not be empty");
  // Bounded so that a typo cannot start thousands of threads (a failed start ended the process)
  // or queue batches until memory runs out.
  k.in_range("data.loader_threads", c.data.loader_threads, 1, 256, ": threads that read and tokenize documents");
  k.in_range("data.prefetch", c.data.prefetch, 1, 1024, ": packed batches queued ahead of the step");
  for (const Phase& ph : resolve_phases(c.train, &k.out)) {
    if (c.model.max_seq_len >= 1 && ph.seq_len > c.model.max_seq_len)
      k.fail("train.phases", "seq_len " + std::to_string(ph.seq_len) + " exceeds model.max_seq_len " +
                                 std::to_string(c.model.max_seq_len));
  }

  const TrainConfig& t = c.train;
  k.at_least("train.steps", t.steps, 1);
  k.at_least("train.batch_size", t.batch_size, 1);
  k.at_least("train.seq_len", t.seq_len, 1);
  k.at_least("train.grad_accum", t.grad_accum, 1);
  k.one_of("train.precision", t.precision, {"auto", "fp32", "bf16", "fp16", "fp8"});
  k.one_of("train.optimizer", t.optimizer, {"adamw", "muon"});
  k.one_of("train.muon_precision", t.muon_precision, {"auto", "bf16", "fp32"});
  k.positive("train.lr", t.lr);
  k.unit_closed("train.lr_final_frac", t.lr_final_frac);
  k.non_negative("train.weight_decay", t.weight_decay);
  k.unit_open("train.beta1", t.beta1);
  k.unit_open("train.beta2", t.beta2);
  k.positive("train.eps", t.eps);
  k.one_of("train.schedule", t.schedule, {"cosine", "wsd", "constant"});
  k.positive("train.muon_lr", t.muon_lr);
  k.one_of("train.loss_scaling", t.loss_scaling, {"auto", "dynamic", "off"});
  k.one_of("train.cuda_graph", t.cuda_graph, {"auto", "on", "off"});
  if (t.cuda_graph_pieces != 0 && t.cuda_graph_pieces < t.batch_size)
    k.fail("train.cuda_graph_pieces", "must be 0 (automatic) or at least train.batch_size = " +
                                          std::to_string(t.batch_size) + " (one piece per row), got " +
                                          std::to_string(t.cuda_graph_pieces));
  k.positive("train.loss_scale_init", t.loss_scale_init);
  k.at_least("train.loss_scale_growth_interval", t.loss_scale_growth_interval, 1);
  k.at_least("train.warmup_steps", t.warmup_steps, 0);
  if (t.warmup_steps > t.steps && t.steps >= 1)
    k.fail("train.warmup_steps", "must be <= train.steps (got " + std::to_string(t.warmup_steps) + " > " +
                                     std::to_string(t.steps) + ")");
  k.non_negative("train.grad_clip", t.grad_clip);
  k.unit_open("train.ema_decay", t.ema_decay);
  k.at_least("train.eval_batches", t.eval_batches, 1);
  k.at_least("train.mup_base_width", t.mup_base_width, 0);
  k.one_of("train.nonfinite", t.nonfinite, {"auto", "skip", "fail"});
  k.at_least("train.max_nonfinite_steps", t.max_nonfinite_steps, 0);
  k.non_negative("train.spike_zscore", t.spike_zscore);
  k.at_least("train.spike_window", t.spike_window, 2);
  k.one_of("train.spike_action", t.spike_action, {"flag", "skip"});
  if (t.spike_action == "skip" && t.spike_zscore == 0)
    k.fail("train.spike_action", "\"skip\" needs spike detection on: set train.spike_zscore > 0 (got 0)");

  const RunSection& r = c.run;
  check_devices(k, r.devices);
  if (r.runs_dir.empty()) k.fail("run.runs_dir", "must not be empty");
  k.at_least("run.log_interval", r.log_interval, 0);
  k.at_least("run.eval_interval", r.eval_interval, 0);
  k.at_least("run.save_interval", r.save_interval, 0);
  if (r.log_interval == 0 && (r.eval_interval > 0 || r.save_interval > 0))
    k.fail("run.log_interval", "must be >= 1 when run.eval_interval or run.save_interval is set (got 0)");
  k.at_least("run.keep_checkpoints", r.keep_checkpoints, 1);
  k.in_range("run.threads", r.threads, 0, 1024, " (0: the library's default)");
  k.non_negative("run.peak_tflops", r.peak_tflops);
  // c10d takes the timeout in whole milliseconds and 0 as "none": below a second a healthy
  // collective fails (or one rounded to 0 never does); above 30 days the conversion overflows.
  if (!(r.collective_timeout_s >= 1 && r.collective_timeout_s <= 2592000))
    k.fail("run.collective_timeout_s",
           "must be in [1, 2592000] seconds (got " + format_double(r.collective_timeout_s) + ")");
  k.in_range("run.bucket_mb", r.bucket_mb, 1, 1 << 20);  // its bytes must fit in int64
  k.at_least("run.save_retries", r.save_retries, 0);
  k.non_negative("run.save_retry_delay_s", r.save_retry_delay_s);
  // Other ranks wait at the next step boundary while rank 0 retries; they must not time out first.
  if (r.save_retries > 0 && std::isfinite(r.save_retry_delay_s) &&
      static_cast<double>(r.save_retries) * r.save_retry_delay_s >= r.collective_timeout_s)
    k.fail("run.save_retry_delay_s", "save_retries x save_retry_delay_s must stay below run.collective_timeout_s (got " +
                                         std::to_string(r.save_retries) + " x " + format_double(r.save_retry_delay_s) +
                                         " >= " + format_double(r.collective_timeout_s) + ")");
  if (r.zero1 && (c.train.optimizer != "adamw" || c.train.mup_base_width > 0))
    k.fail("run.zero1", "shards AdamW's state only: use train.optimizer = \"adamw\" without train.mup_base_width");
  return k.out;
}

std::vector<Phase> resolve_phases(const TrainConfig& t, std::vector<std::string>* errors) {
  std::vector<Phase> out;
  auto fail = [&](const std::string& what) {
    if (errors) errors->push_back("train.phases: " + what);
  };
  if (t.phases.empty()) return {{0, t.seq_len, t.batch_size}};
  for (const std::string& spec : t.phases) {
    // "TOKENS:SEQ_LENxBATCH"; TOKENS may be written as 5e6.
    const auto colon = spec.find(':'), x = spec.find('x', colon == std::string::npos ? 0 : colon);
    Phase ph;
    bool ok = colon != std::string::npos && x != std::string::npos;
    if (ok) {
      try {
        size_t used = 0;
        const double tokens = std::stod(spec.substr(0, colon), &used);
        // Below 2^62 tokens: past 2^63 the conversion is undefined.
        ok = used == colon && std::isfinite(tokens) && tokens >= 0 && tokens == std::floor(tokens) && tokens < 0x1p62;
        ph.tokens = ok ? static_cast<int64_t>(tokens) : 0;
        ph.seq_len = std::stoll(spec.substr(colon + 1, x - colon - 1), &used);
        ok = ok && used == x - colon - 1;
        ph.batch_size = std::stoll(spec.substr(x + 1), &used);
        ok = ok && used == spec.size() - x - 1;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok || ph.seq_len < 1 || ph.batch_size < 1) {
      fail("each phase is \"TOKENS:SEQ_LENxBATCH\" with TOKENS a whole number below 2^62 and SEQ_LEN, BATCH >= 1, "
           "e.g. \"0:256x32\" (got " + quote(spec) + ")");
      continue;
    }
    if (out.empty() && ph.tokens != 0) fail("the first phase must start at 0 tokens (got " + quote(spec) + ")");
    if (!out.empty() && ph.tokens <= out.back().tokens)
      fail("phases must start at increasing token counts (got " + quote(spec) + " after " +
           std::to_string(out.back().tokens) + ")");
    out.push_back(ph);
  }
  if (out.empty()) return {{0, t.seq_len, t.batch_size}};
  return out;
}

ConfigResult parse_config(const std::string& toml_text, const std::string& source_name,
                          const std::vector<std::string>& overrides) {
  ConfigResult result;
  const std::string source = source_name.empty() ? "<config>" : source_name;
  try {
    toml::table doc;
    try {
      doc = toml::parse(toml_text, source);
    } catch (const toml::parse_error& err) {
      std::ostringstream s;
      s << source << ":" << err.source().begin.line << ":" << err.source().begin.column << ": "
        << err.description();
      result.errors.push_back(s.str());
      return result;
    }

    Errors e;
    for (const std::string& o : overrides) apply_override(doc, o, e);
    extract(doc, result.config, e);
    result.errors = std::move(e.lines);
    for (const std::string& line : validate(result.config)) {
      // A key whose value was rejected still holds its default; don't also judge the default.
      if (!e.keys.count(line.substr(0, line.find(':')))) result.errors.push_back(line);
    }
  } catch (const std::exception& ex) {
    result.errors.push_back(source + ": internal error while reading the config: " + ex.what());
  }
  return result;
}

ConfigResult load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    ConfigResult r;
    r.errors.push_back(path + ": cannot read config file (" + std::strerror(errno) + ")");
    return r;
  }
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f);
  const int err = errno;
  std::fclose(f);
  if (failed) {
    ConfigResult r;
    r.errors.push_back(path + ": cannot read config file (" + std::strerror(err) + ")");
    return r;
  }
  return parse_config(text, path, overrides);
}

std::string to_toml(const RunConfig& c) {
  RunConfig copy = c;  // the field accessors hand out mutable references
  std::string out;
  std::string section = "";
  for (const Field& f : fields()) {
    if (section != f.section) {
      section = f.section;
      out += "\n[" + section + "]\n";
    }
    out += std::string(f.key) + " = " + toml_value(f, copy) + "\n";
  }
  return out;
}

std::string to_json(const RunConfig& c) {
  RunConfig copy = c;
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const Field& f : fields()) {
    nlohmann::ordered_json& dst = *f.section ? j[f.section][f.key] : j[f.key];
    std::visit(Overloaded{
                   [&](IntRef r) { dst = r(copy); },
                   [&](UintRef r) { dst = r(copy); },
                   [&](FloatRef r) { dst = r(copy); },
                   [&](BoolRef r) { dst = r(copy); },
                   [&](StringRef r) { dst = r(copy); },
                   [&](ListRef r) { dst = r(copy); },
                   [&](FamilyRef r) { dst = model::family_name(r(copy)); },
                   [&](NumListRef r) { dst = r(copy); },
                   [&](ValRef r) {
                     const DataConfig& d = r(copy);
                     if (d.val_sources.empty()) dst = d.val_fraction;
                     else dst = d.val_sources;
                   },
               },
               f.ref);
  }
  return j.dump(2);
}

}  // namespace trainer
