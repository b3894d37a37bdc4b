// Packing: documents, in a deterministic per-rank order, become fixed B×T batches with no padding.
// Every document is its tokens followed by EOT; rows are consecutive stretches of that stream (a
// document longer than what is left of a row continues in the next row), labels are the stream
// shifted by one, and cu_seqlens marks every document piece so attention never crosses a document.
//
//   DocumentSequence  which (source, document) comes next on this rank: seeded, weighted across
//                     sources, sharded round-robin across ranks, a fresh shuffle per source epoch
//   DocFetcher        reads/tokenizes the next documents on producer threads, handed out in order
//   Packer            cuts the token stream into batches, following the progressive phases
//
// A resume needs only PackerState: the sequence state before the document the next batch starts
// in and the offset into it. The fetcher's read-ahead is never part of the state. No torch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trainer/config.h"
#include "trainer/data/source.h"

namespace trainer::data {

// splitmix64: the seeded hash behind splits, source choice and shuffles.
uint64_t mix64(uint64_t x);

struct DocumentPick {
  int32_t source = 0;
  int64_t doc = 0;  // index into that source
};

struct SequenceState {
  int64_t draws = 0;             // documents drawn so far, on all ranks together
  std::vector<int64_t> cursors;  // per source: documents taken from it so far (all ranks)
};

// The order documents are read in. Each draw picks a source with probability proportional to its
// weight (a counter-based hash of seed and draw number, so no RNG state), then that source's next
// document in its current epoch's shuffle; draw k belongs to rank k mod world.
class DocumentSequence {
 public:
  // eligible[s]: the document indices of source s in this split (train or validation), ascending.
  // weights empty: proportional to the eligible document counts. shuffle=false keeps index order
  // and takes the sources one after another, ignoring the weights (validation: one pass reads each
  // document once). Throws std::invalid_argument when a source has no eligible documents.
  DocumentSequence(std::vector<std::vector<int64_t>> eligible, std::vector<double> weights, uint64_t seed,
                   int64_t rank, int64_t world, bool shuffle);
  DocumentPick next();
  const SequenceState& state() const { return state_; }
  void restore(const SequenceState& s);
  int64_t documents(int32_t source) const { return static_cast<int64_t>(eligible_[source].size()); }

 private:
  DocumentPick draw();  // the next draw for any rank
  int64_t doc_at(int32_t source, int64_t cursor);
  std::vector<std::vector<int64_t>> eligible_;
  std::vector<double> cumulative_;  // normalised cumulative weights
  uint64_t seed_;
  int64_t rank_, world_;
  bool shuffle_;
  SequenceState state_;
  std::vector<int64_t> perm_epoch_;              // per source: the epoch perm_ holds
  std::vector<std::vector<int64_t>> perm_;       // per source: that epoch's order
};

// One document ready for packing.
struct FetchedDocument {
  DocumentPick pick;
  SequenceState before;          // the sequence state before this pick (resume point)
  std::vector<int32_t> tokens;   // the document's tokens and its trailing EOT
};

// Reads the documents of a sequence ahead of the packer on `threads` producer threads (0: on the
// caller's thread, for tests), keeping at most `lookahead` documents in flight, and hands them out
// strictly in sequence order. An error in a producer is rethrown by take() at that document.
class DocFetcher {
 public:
  DocFetcher(DocumentSequence seq, std::vector<const Source*> sources, const Tokenizer& tok, int64_t threads,
             int64_t lookahead);
  ~DocFetcher();
  DocFetcher(const DocFetcher&) = delete;
  DocFetcher& operator=(const DocFetcher&) = delete;
  // The next document in order; blocks until a producer has it. Packer thread only.
  FetchedDocument take();

 private:
  struct Slot {
    FetchedDocument doc;
    bool ready = false;
    std::exception_ptr error;
  };
  void produce();
  // Asks the workers to stop and joins them (the destructor, and a constructor that failed).
  void stop_workers();
  DocumentSequence seq_;
  std::vector<const Source*> sources_;
  const Tokenizer& tok_;
  int64_t lookahead_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Slot> slots_;  // slots_[0] is the next document take() returns
  int64_t claimed_ = 0;     // slots handed to producers (counted from slots_[0])
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

struct PackedBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> inputs;      // [B*T]
  std::vector<int32_t> labels;      // [B*T], -1 = ignored
  std::vector<int32_t> cu_seqlens;  // document pieces over the flattened B*T tokens, row ends included
  int32_t max_seqlen = 0;           // longest piece
  int64_t ignored_labels = 0;       // labels set to -1 (boundary masking)
};

struct PackerState {
  SequenceState before;   // sequence state before the document the next batch starts in
  int64_t offset = 0;     // tokens of that document already consumed
  int64_t tokens = 0;     // training tokens packed so far (inputs), for the phases
  int64_t batches = 0;
  // Which training documents the position counts over (the loader's corpus_id: files, their
  // sizes, document counts, the validation split, the seed); 0 when unknown (states written
  // before it was kept). Not the packer's own: the loader sets it and compares it at a resume.
  uint64_t corpus = 0;
};
std::string encode_state(const PackerState& s);
// Throws std::runtime_error naming `where` when the text is not a state this version wrote.
PackerState decode_state(const std::string& text, const std::string& where);

struct PackOptions {
  std::vector<Phase> phases;          // at least one, the first at 0 tokens
  // A phase is chosen at the first micro-batch of each step, from the tokens every rank has packed
  // before it (this rank's × world, as the run counts `tokens` and the dry run's schedule does);
  // the step's other micro-batches keep its shape, so one step never mixes two.
  int64_t world = 1;
  int64_t micro_batches_per_step = 1;
  bool mask_boundary_labels = false;  // label -1 where it would cross into the next document
};

class Packer {
 public:
  // `fetcher` must start at `start.before` (a fresh fetcher over a sequence restored to it).
  Packer(DocFetcher& fetcher, PackOptions opts, const PackerState& start = {});
  // The next batch and the state after it. Packer thread only; rethrows source errors.
  PackedBatch next();
  const PackerState& state() const { return state_; }
  // The phase in force after `tokens` packed tokens.
  const Phase& phase_at(int64_t tokens) const;

 private:
  // Ensures docs_ holds the document `index` positions past the cursor's (0 = the cursor's own).
  const FetchedDocument& doc(size_t index);
  // Appends one row of T inputs/labels starting at the cursor and advances the cursor by T.
  void pack_row(int64_t T, PackedBatch& b);
  DocFetcher& fetcher_;
  PackOptions opts_;
  PackerState state_;
  const Phase* step_phase_ = nullptr;  // the phase of the step under way (see PackOptions)
  std::deque<FetchedDocument> docs_;  // docs_[0] holds the cursor at state_.offset
};

}  // namespace trainer::data
