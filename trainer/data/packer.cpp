// Packing in three stages (see packer.h). The hash-based source choice and per-epoch shuffles
// make the order a pure function of (seed, draw number), which is what makes resume exact and
// lets every rank agree on the order without talking to the others.
#include "trainer/data/packer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <system_error>


namespace trainer::data {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// ---- DocumentSequence

DocumentSequence::DocumentSequence(std::vector<std::vector<int64_t>> eligible, std::vector<double> weights,
                                   uint64_t seed, int64_t rank, int64_t world, bool shuffle)
    : eligible_(std::move(eligible)), seed_(seed), rank_(rank), world_(world), shuffle_(shuffle) {
  if (eligible_.empty()) throw std::invalid_argument("data: no sources");
  if (world_ < 1 || rank_ < 0 || rank_ >= world_) throw std::invalid_argument("data: bad rank/world");
  if (weights.empty())
    for (const auto& e : eligible_) weights.push_back(static_cast<double>(e.size()));
  if (weights.size() != eligible_.size()) throw std::invalid_argument("data.weights: one weight per source");
  double total = 0;
  for (size_t s = 0; s < eligible_.size(); ++s) {
    if (eligible_[s].empty()) throw std::invalid_argument("data: source " + std::to_string(s) + " has no documents in this split");
    total += weights[s];
  }
  double run = 0;
  for (double w : weights) cumulative_.push_back((run += w) / total);
  cumulative_.back() = 1.0;
  state_.cursors.assign(eligible_.size(), 0);
  perm_epoch_.assign(eligible_.size(), -1);
  perm_.resize(eligible_.size());
}

int64_t DocumentSequence::doc_at(int32_t s, int64_t cursor) {
  const auto& docs = eligible_[s];
  const int64_t n = static_cast<int64_t>(docs.size());
  const int64_t epoch = cursor / n, i = cursor % n;
  if (!shuffle_) return docs[i];
  if (perm_epoch_[s] != epoch) {
    perm_[s] = docs;
    std::mt19937_64 rng(mix64(seed_ ^ mix64(static_cast<uint64_t>(epoch) * 1000003ULL + static_cast<uint64_t>(s) + 1)));
    std::shuffle(perm_[s].begin(), perm_[s].end(), rng);
    perm_epoch_[s] = epoch;
  }
  return perm_[s][i];
}

DocumentPick DocumentSequence::draw() {
  int32_t s = 0;
  if (!shuffle_ && cumulative_.size() > 1) {
    // In order: the sources one after another (the first one not through its current pass), so a
    // single pass (validation) reads every document once; a random choice wrapped one source
    // while others still had documents.
    int64_t pass = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < eligible_.size(); ++i) {
      const int64_t p = state_.cursors[i] / static_cast<int64_t>(eligible_[i].size());
      if (p < pass) {
        pass = p;
        s = static_cast<int32_t>(i);
      }
    }
  } else if (cumulative_.size() > 1) {
    const double u = static_cast<double>(mix64(seed_ ^ mix64(static_cast<uint64_t>(state_.draws) + 0x5eed)) >> 11) *
                     (1.0 / 9007199254740992.0);
    s = static_cast<int32_t>(std::upper_bound(cumulative_.begin(), cumulative_.end(), u) - cumulative_.begin());
    s = std::min<int32_t>(s, static_cast<int32_t>(cumulative_.size()) - 1);
  }
  const int64_t doc = doc_at(s, state_.cursors[s]++);
  ++state_.draws;
  return {s, doc};
}

DocumentPick DocumentSequence::next() {
  // Draws of the other ranks still advance the cursors: every rank replays the same sequence.
  for (;;) {
    const bool mine = state_.draws % world_ == rank_;
    DocumentPick p = draw();
    if (mine) return p;
  }
}

void DocumentSequence::restore(const SequenceState& s) {
  if (s.cursors.size() != eligible_.size())
    throw std::runtime_error("data: the saved loader position has " + std::to_string(s.cursors.size()) +
                             " sources, the config has " + std::to_string(eligible_.size()));
  state_ = s;
}

// ---- DocFetcher

DocFetcher::DocFetcher(DocumentSequence seq, std::vector<const Source*> sources, const Tokenizer& tok, int64_t threads,
                       int64_t lookahead)
    : seq_(std::move(seq)), sources_(std::move(sources)), tok_(tok), lookahead_(std::max<int64_t>(1, lookahead)) {
  for (int64_t i = 0; i < threads; ++i) {
    try {
      workers_.emplace_back([this] { produce(); });
    } catch (const std::system_error& e) {
      // The threads already started must be joined before the members go, or std::terminate.
      stop_workers();
      throw std::runtime_error("data.loader_threads: could not start loader thread " + std::to_string(i + 1) +
                               " of " + std::to_string(threads) + " (" + e.what() + ")");
    }
  }
}

DocFetcher::~DocFetcher() { stop_workers(); }

void DocFetcher::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void DocFetcher::produce() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || claimed_ < lookahead_; });
    if (stop_) return;
    // Claim the next document of the sequence; the pick is drawn under the lock, in order.
    slots_.emplace_back();
    Slot* slot = &slots_.back();
    ++claimed_;
    slot->doc.before = seq_.state();
    slot->doc.pick = seq_.next();
    const DocumentPick pick = slot->doc.pick;
    lock.unlock();
    std::vector<int32_t> tokens;
    std::exception_ptr error;
    try {
      sources_[pick.source]->read_document(pick.doc, tok_, tokens);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    // deque::emplace_back keeps references to other elements valid; take() pops only ready fronts.
    slot->doc.tokens = std::move(tokens);
    slot->error = error;
    slot->ready = true;
    cv_.notify_all();
  }
}

FetchedDocument DocFetcher::take() {
  if (workers_.empty()) {
    FetchedDocument d;
    d.before = seq_.state();
    d.pick = seq_.next();
    sources_[d.pick.source]->read_document(d.pick.doc, tok_, d.tokens);
    return d;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !slots_.empty() && slots_.front().ready; });
  Slot slot = std::move(slots_.front());
  slots_.pop_front();
  --claimed_;
  lock.unlock();
  cv_.notify_all();
  if (slot.error) std::rethrow_exception(slot.error);
  return std::move(slot.doc);
}

// ---- state text

std::string encode_state(const PackerState& s) {
  std::ostringstream o;
  o << "v2 " << s.before.draws << " " << s.offset << " " << s.tokens << " " << s.batches << " " << s.before.cursors.size();
  for (int64_t c : s.before.cursors) o << " " << c;
  o << " " << std::hex << s.corpus;
  return o.str();
}

PackerState decode_state(const std::string& text, const std::string& where) {
  std::istringstream in(text);
  std::string version;
  PackerState s;
  size_t n = 0;
  in >> version >> s.before.draws >> s.offset >> s.tokens >> s.batches >> n;
  if ((version != "v1" && version != "v2") || !in || n > 1000000)
    throw std::runtime_error(where + ": loader position \"" + text + "\" is not one this version wrote");
  s.before.cursors.resize(n);
  for (auto& c : s.before.cursors) in >> c;
  if (version == "v2") in >> std::hex >> s.corpus;  // v1 (older checkpoints): corpus unknown, 0
  if (!in) throw std::runtime_error(where + ": loader position \"" + text + "\" is truncated");
  return s;
}

// ---- Packer

Packer::Packer(DocFetcher& fetcher, PackOptions opts, const PackerState& start)
    : fetcher_(fetcher), opts_(std::move(opts)), state_(start) {
  if (opts_.phases.empty()) throw std::invalid_argument("data: no phases");
}

const Phase& Packer::phase_at(int64_t tokens) const {
  size_t i = 0;
  while (i + 1 < opts_.phases.size() && opts_.phases[i + 1].tokens <= tokens) ++i;
  return opts_.phases[i];
}

const FetchedDocument& Packer::doc(size_t index) {
  while (docs_.size() <= index) {
    docs_.push_back(fetcher_.take());
    // A resumed packer starts inside its first document.
    if (docs_.size() == 1 && state_.offset >= static_cast<int64_t>(docs_[0].tokens.size()))
      throw std::runtime_error("data: the saved loader position points past the end of its document; the corpus "
                               "changed since the checkpoint was written (restore the files it was written over to "
                               "resume from it)");
  }
  return docs_[index];
}

void Packer::pack_row(int64_t T, PackedBatch& b) {
  const int32_t row_start = static_cast<int32_t>(b.inputs.size());
  int64_t filled = 0;
  size_t di = 0;
  int64_t off = state_.offset;
  while (filled < T) {
    const auto& d = doc(di);
    const int64_t size = static_cast<int64_t>(d.tokens.size());
    const int64_t m = std::min<int64_t>(T - filled, size - off);
    const int32_t* src = d.tokens.data() + off;
    b.inputs.insert(b.inputs.end(), src, src + m);
    // Labels are the next stream token: m-1 of them inside the piece, then either the document's
    // next token or, at its end (the EOT), the next document's first token — or -1 when masked.
    b.labels.insert(b.labels.end(), src + 1, src + m);
    if (off + m < size) {
      b.labels.push_back(src[m]);
    } else {
      const int32_t next_first = doc(di + 1).tokens[0];
      if (opts_.mask_boundary_labels) {
        b.labels.push_back(-1);
        ++b.ignored_labels;
      } else {
        b.labels.push_back(next_first);
      }
    }
    filled += m;
    b.cu_seqlens.push_back(row_start + static_cast<int32_t>(filled));
    b.max_seqlen = std::max<int32_t>(b.max_seqlen, static_cast<int32_t>(m));
    off += m;
    if (off == size) {
      ++di;
      off = 0;
    }
  }
  // Drop the documents the cursor has left behind.
  for (size_t i = 0; i < di; ++i) {
    state_.before = docs_[1].before;
    docs_.pop_front();
  }
  state_.offset = off;
}

PackedBatch Packer::next() {
  // Checkpoints, and so resumes, fall on step boundaries: there the phase is chosen again.
  if (step_phase_ == nullptr || state_.batches % std::max<int64_t>(1, opts_.micro_batches_per_step) == 0)
    step_phase_ = &phase_at(state_.tokens * std::max<int64_t>(1, opts_.world));
  const Phase& ph = *step_phase_;
  PackedBatch b;
  b.B = ph.batch_size;
  b.T = ph.seq_len;
  b.inputs.reserve(static_cast<size_t>(b.B * b.T));
  b.labels.reserve(static_cast<size_t>(b.B * b.T));
  b.cu_seqlens.push_back(0);
  for (int64_t r = 0; r < b.B; ++r) pack_row(b.T, b);
  state_.tokens += b.B * b.T;
  ++state_.batches;
  return b;
}

}  // namespace trainer::data
