// Loader threads: one packer thread owns the Packer and pushes ready batches into a bounded
// channel; the DocFetcher's producer threads read and tokenize documents ahead of it. The step
// loop pops. Errors travel through the channel as exceptions and are rethrown by next().
#include "trainer/data/loader.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <variant>

#include "storage/file_util.h"
#include "trainer/channel.h"
#include "trainer/config.h"
#include "trainer/data/packer.h"
#include "trainer/data/source.h"
#include "trainer/data/tokenizer.h"

namespace trainer::data {

namespace {

using Item = std::variant<Batch, std::exception_ptr>;

// Host tensors the step loop can copy to a GPU asynchronously: pinned when CUDA is present.
torch::Tensor host_tensor(const std::vector<int32_t>& v, std::vector<int64_t> shape, torch::ScalarType dtype) {
  auto opts = torch::TensorOptions().dtype(dtype).pinned_memory(torch::cuda::is_available());
  auto t = torch::empty(shape, opts);
  if (dtype == torch::kInt64) {
    int64_t* dst = t.data_ptr<int64_t>();
    for (size_t i = 0; i < v.size(); ++i) dst[i] = v[i];
  } else {
    std::memcpy(t.data_ptr<int32_t>(), v.data(), v.size() * sizeof(int32_t));
  }
  return t;
}

Batch to_batch(const PackedBatch& p, bool document_attention, const std::string& state_after) {
  Batch b;
  b.inputs = host_tensor(p.inputs, {p.B, p.T}, torch::kInt64);
  b.labels = host_tensor(p.labels, {p.B, p.T}, torch::kInt64);
  if (document_attention) b.cu_seqlens = host_tensor(p.cu_seqlens, {static_cast<int64_t>(p.cu_seqlens.size())}, torch::kInt32);
  b.max_seqlen = p.max_seqlen;
  b.pieces = static_cast<int64_t>(p.cu_seqlens.size()) - 1;
  b.ignored_labels = p.ignored_labels;
  b.state_after = state_after;
  return b;
}

// Whether document i of source s is held out for validation (data.val as a fraction).
bool held_out(uint64_t seed, size_t s, int64_t i, double fraction) {
  const uint64_t h = mix64(seed ^ mix64((static_cast<uint64_t>(s) << 40) ^ static_cast<uint64_t>(i)));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0) < fraction;
}

}  // namespace

struct Loader::Impl {
  RunConfig cfg;
  std::unique_ptr<Tokenizer> tok;
  std::vector<std::unique_ptr<Source>> train_sources, val_sources;
  std::vector<std::vector<int64_t>> train_eligible, val_eligible;
  std::unique_ptr<DocFetcher> fetcher;
  std::unique_ptr<Packer> packer;
  Channel<Item> ready;
  std::thread packer_thread;
  std::vector<Batch> validation;
  LoaderStats stats;

  explicit Impl(const RunConfig& c) : cfg(c), ready(static_cast<size_t>(std::max<int64_t>(1, c.data.prefetch))) {}

  SourceOptions options_for(const std::string& key) const {
    return source_options(cfg.data, cfg.model.vocab_size, key);
  }

  void open_sources() {
    tok = make_tokenizer(cfg.data.tokenizer);
    for (size_t i = 0; i < cfg.data.train.size(); ++i)
      train_sources.push_back(open_source(cfg.data.train[i], options_for("data.train[" + std::to_string(i) + "]"), *tok));
    for (size_t i = 0; i < cfg.data.val_sources.size(); ++i)
      val_sources.push_back(open_source(cfg.data.val_sources[i], options_for("data.val[" + std::to_string(i) + "]"), *tok));
    const bool split_by_fraction = val_sources.empty();
    train_eligible.resize(train_sources.size());
    if (split_by_fraction) val_eligible.resize(train_sources.size());
    for (size_t s = 0; s < train_sources.size(); ++s) {
      const int64_t n = train_sources[s]->num_documents();
      for (int64_t i = 0; i < n; ++i) {
        if (split_by_fraction && held_out(cfg.seed, s, i, cfg.data.val_fraction)) val_eligible[s].push_back(i);
        else train_eligible[s].push_back(i);
      }
      if (train_eligible[s].empty())
        throw std::runtime_error("data.val: every document of data.train[" + std::to_string(s) + "] (" +
                                 cfg.data.train[s] + ") went to validation; lower data.val");
      stats.train_documents += static_cast<int64_t>(train_eligible[s].size());
    }
    if (!split_by_fraction) {
      for (const auto& src : val_sources) {
        std::vector<int64_t> all(static_cast<size_t>(src->num_documents()));
        for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
        val_eligible.push_back(std::move(all));
      }
    }
    for (const auto& e : val_eligible) stats.val_documents += static_cast<int64_t>(e.size());
  }

  // Validation: the held-out documents in index order, packed once into fixed batches of
  // train.batch_size rows × train.seq_len (at most train.eval_batches of them).
  void build_validation() {
    if (stats.val_documents == 0) {
      if (!cfg.data.val_sources.empty() || cfg.data.val_fraction > 0)
        throw std::runtime_error("data.val: the validation split came out empty (" +
                                 std::to_string(stats.train_documents) + " training documents); raise data.val or "
                                 "name validation sources");
      return;
    }
    const int64_t T = cfg.train.seq_len, B = cfg.train.batch_size;
    const int64_t want_rows = cfg.train.eval_batches * B;
    std::vector<std::vector<int64_t>> eligible;
    std::vector<const Source*> sources;
    std::vector<double> weights;
    const auto& srcs = val_sources.empty() ? train_sources : val_sources;
    for (size_t s = 0; s < srcs.size(); ++s) {
      if (val_eligible[s].empty()) continue;
      eligible.push_back(val_eligible[s]);
      sources.push_back(srcs[s].get());
      weights.push_back(static_cast<double>(val_eligible[s].size()));
    }
    // One pass over the split, no reshuffle: stop at its end rather than wrap into a second epoch.
    int64_t tokens_available = 0;
    std::vector<int32_t> scratch;
    for (size_t s = 0; s < eligible.size(); ++s) {
      for (int64_t i : eligible[s]) {
        const int64_t n = sources[s]->document_tokens(i);
        if (n >= 0) {
          tokens_available += n + 1;
        } else {
          scratch.clear();
          sources[s]->read_document(i, *tok, scratch);
          tokens_available += static_cast<int64_t>(scratch.size());
        }
        if (tokens_available > want_rows * T) break;
      }
      if (tokens_available > want_rows * T) break;
    }
    const int64_t rows = std::min(want_rows, (tokens_available - 1) / T);
    if (rows < 1)
      throw std::runtime_error("data.val: the validation split holds " + std::to_string(tokens_available) +
                               " tokens, fewer than one row of train.seq_len + 1 = " + std::to_string(T + 1) +
                               "; raise data.val");
    PackOptions o;
    o.mask_boundary_labels = cfg.data.mask_boundary_labels;
    // Rows come one at a time from one packer (so no document restarts between batches) and are
    // merged into batches of up to B rows.
    DocumentSequence seq(eligible, weights, cfg.seed, 0, 1, /*shuffle=*/false);
    DocFetcher fetch(std::move(seq), sources, *tok, 0, 1);
    o.phases = {{0, T, 1}};
    Packer rows_packer(fetch, o);
    for (int64_t done = 0; done < rows;) {
      const int64_t b = std::min(B, rows - done);
      PackedBatch merged;
      merged.B = b;
      merged.T = T;
      merged.cu_seqlens.push_back(0);
      for (int64_t r = 0; r < b; ++r) {
        PackedBatch row = rows_packer.next();
        const int32_t base = static_cast<int32_t>(merged.inputs.size());
        merged.inputs.insert(merged.inputs.end(), row.inputs.begin(), row.inputs.end());
        merged.labels.insert(merged.labels.end(), row.labels.begin(), row.labels.end());
        for (size_t j = 1; j < row.cu_seqlens.size(); ++j) merged.cu_seqlens.push_back(base + row.cu_seqlens[j]);
        merged.max_seqlen = std::max(merged.max_seqlen, row.max_seqlen);
        merged.ignored_labels += row.ignored_labels;
      }
      validation.push_back(to_batch(merged, cfg.data.document_attention, ""));
      stats.val_tokens += b * T;
      done += b;
    }
  }

  // An FNV-1a hash of what the training documents' order depends on: each source's spec, its files'
  // paths and sizes, its document count and which documents are held out, the weights and the seed.
  uint64_t corpus_id() const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](const void* p, size_t n) {
      for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
    };
    auto mix_int = [&](int64_t v) { mix(&v, sizeof v); };
    auto mix_text = [&](const std::string& t) {
      mix_int(static_cast<int64_t>(t.size()));
      mix(t.data(), t.size());
    };
    mix_int(static_cast<int64_t>(cfg.seed));
    for (double w : cfg.data.weights) mix(&w, sizeof w);
    for (size_t s = 0; s < train_sources.size(); ++s) {
      mix_text(cfg.data.train[s]);
      for (const std::string& f : train_sources[s]->files()) {
        mix_text(f);
        mix_int(storage::files::file_size(f));
      }
      mix_int(train_sources[s]->num_documents());
      mix_int(static_cast<int64_t>(train_eligible[s].size()));
      mix(train_eligible[s].data(), train_eligible[s].size() * sizeof(int64_t));
    }
    return h == 0 ? 1 : h;  // 0 means "unknown" in a saved state
  }

  void run_packer() {
    try {
      for (;;) {
        PackedBatch p = packer->next();
        if (!ready.push(to_batch(p, cfg.data.document_attention, encode_state(packer->state())))) return;
      }
    } catch (...) {
      ready.push(std::current_exception());
    }
  }
};

Loader::Loader(const RunConfig& cfg, int64_t rank, int64_t world, const std::string& resume_state)
    : impl_(std::make_unique<Impl>(cfg)) {
  Impl& m = *impl_;
  m.open_sources();
  m.build_validation();
  PackerState start;
  start.before.cursors.assign(m.train_sources.size(), 0);
  const uint64_t corpus = m.corpus_id();
  if (!resume_state.empty()) {
    start = decode_state(resume_state, "checkpoint loader.state");
    if (start.corpus != 0 && start.corpus != corpus) {
      // The same place in another document order: start it at a document's beginning, since the
      // saved offset belonged to another document.
      start.offset = 0;
      m.stats.resume_note =
          "data: the training documents are not those the checkpoint's loader position was taken over (files "
          "added, removed or resized, or data.val, data.weights or the seed changed); the resumed run goes on "
          "from the same point of the new document order, so some documents may repeat or be skipped";
    }
  }
  start.corpus = corpus;
  DocumentSequence seq(m.train_eligible, cfg.data.weights, cfg.seed, rank, world, /*shuffle=*/true);
  seq.restore(start.before);
  std::vector<const Source*> sources;
  for (const auto& s : m.train_sources) sources.push_back(s.get());
  // Enough documents in flight to cover a couple of batches of short documents.
  m.fetcher = std::make_unique<DocFetcher>(std::move(seq), sources, *m.tok, cfg.data.loader_threads,
                                           std::max<int64_t>(64, 4 * cfg.data.loader_threads));
  PackOptions o;
  o.phases = resolve_phases(cfg.train);
  o.world = world;
  o.micro_batches_per_step = cfg.train.grad_accum;
  o.mask_boundary_labels = cfg.data.mask_boundary_labels;
  m.packer = std::make_unique<Packer>(*m.fetcher, o, start);
  m.packer_thread = std::thread([&m] { m.run_packer(); });
}

Loader::~Loader() {
  // Closing the channel makes a blocked push return false, so the packer thread exits; the
  // fetcher's destructor then stops its producers.
  impl_->ready.close();
  if (impl_->packer_thread.joinable()) impl_->packer_thread.join();
}

Batch Loader::next(double* wait_s) {
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<Item> item = impl_->ready.pop();
  if (wait_s) *wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!item) throw std::runtime_error("data: the loader stopped");
  if (auto* err = std::get_if<std::exception_ptr>(&*item)) std::rethrow_exception(*err);
  return std::move(std::get<Batch>(*item));
}

int64_t Loader::queue_depth() const { return static_cast<int64_t>(impl_->ready.size()); }

const std::vector<Batch>& Loader::validation() const { return impl_->validation; }

const LoaderStats& Loader::stats() const { return impl_->stats; }

}  // namespace trainer::data
