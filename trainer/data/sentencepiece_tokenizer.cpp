// SentencePiece: loading a .model (the tokenizer) and training one (`deltadeck tokenizer train`).
// Models are trained to round-trip any text exactly: identity normalization, no dummy prefix, no
// whitespace folding, byte fallback for characters outside the vocabulary, and "\n" as its own
// piece (training reads lines, so it would otherwise never see one). An LLM that learns from
// NFKC-folded text cannot reproduce the original bytes.
#include "trainer/data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include "trainer/data/source_internal.h"

namespace trainer::data {

namespace {

constexpr const char* EOT_PIECE = "<|eot|>";

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) {
      throw std::runtime_error(path + ": cannot open the SentencePiece model (" + std::strerror(errno) +
                               ")\n---> HINT: train one with `deltadeck tokenizer train --input GLOB --vocab-size N "
                               "--out F.model`");
    }
    const auto status = sp_.Load(path);
    if (!status.ok()) {
      throw std::runtime_error(path + ": byte 0: not a SentencePiece model (" + status.ToString() + ")");
    }
    vocab_ = sp_.GetPieceSize();
    const int id = sp_.PieceToId(EOT_PIECE);
    if (id < 0 || id >= vocab_ || sp_.IdToPiece(id) != EOT_PIECE) {
      throw std::runtime_error(path + ": has no \"<|eot|>\" piece; expected the end-of-document symbol that " +
                               "`deltadeck tokenizer train` adds\n---> HINT: retrain with deltadeck, or add " +
                               "<|eot|> to --user_defined_symbols when training with spm_train");
    }
    eot_ = id;
  }

  int64_t vocab_size() const override { return vocab_; }
  int32_t eot() const override { return eot_; }
  bool needs_utf8() const override { return true; }

  void encode(std::string_view text, std::vector<int32_t>& out, const std::string& where) const override {
    const int64_t bad = first_invalid_utf8(text);
    if (bad >= 0) {
      throw std::runtime_error(where + ": byte " + std::to_string(bad) +
                               " of the document: invalid UTF-8; expected UTF-8 text (SentencePiece)");
    }
    // SentencePiece matches a user-defined piece wherever its text occurs, so a document quoting
    // "<|eot|>" would get the end-of-document id there and be cut in two by the packer. Each
    // occurrence is encoded as the two plain texts "<|eot" and "|>", which decode back to it.
    const std::string_view eot_text(EOT_PIECE);
    size_t at = 0;
    while (true) {
      const size_t hit = text.find(eot_text, at);
      encode_plain(text.substr(at, hit == std::string_view::npos ? std::string_view::npos : hit - at), out, where);
      if (hit == std::string_view::npos) break;
      encode_plain(eot_text.substr(0, eot_text.size() - 2), out, where);
      encode_plain(eot_text.substr(eot_text.size() - 2), out, where);
      at = hit + eot_text.size();
    }
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out, piece;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      piece.clear();
      if (sp_.Decode(run, &piece).ok()) out += piece;
      run.clear();
    };
    for (int32_t id : ids) {
      if (id == eot_) {
        flush();
        out += "\n<|eot|>\n";
      } else {
        run.push_back(id >= 0 && id < vocab_ ? id : sp_.unk_id());
      }
    }
    flush();
    return out;
  }

 private:
  // Text holding no "<|eot|>": SentencePiece's ids for it as they are.
  void encode_plain(std::string_view text, std::vector<int32_t>& out, const std::string& where) const {
    if (text.empty()) return;
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) throw std::runtime_error(where + ": SentencePiece cannot encode (" + status.ToString() + ")");
    out.insert(out.end(), ids.begin(), ids.end());
  }

  sentencepiece::SentencePieceProcessor sp_;
  int64_t vocab_ = 0;
  int32_t eot_ = 0;
};

// Feeds SentencePiece the non-blank lines of every document of every input, in index order.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::vector<std::unique_ptr<detail::TextDocumentSource>> sources)
      : sources_(std::move(sources)) {
    advance();
  }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }
  const std::string& error() const { return error_; }

 private:
  void advance() {
    try {
      while (true) {
        while (pos_ < text_.size()) {
          size_t nl = text_.find('\n', pos_);
          if (nl == std::string::npos) nl = text_.size();
          size_t end = nl;
          if (end > pos_ && text_[end - 1] == '\r') --end;
          const size_t begin = pos_;
          pos_ = nl + 1;
          if (!detail::is_blank(text_.data() + begin, end - begin)) {
            line_.assign(text_, begin, end - begin);
            return;
          }
        }
        if (source_ >= sources_.size()) {
          done_ = true;
          return;
        }
        if (doc_ >= sources_[source_]->num_documents()) {
          ++source_;
          doc_ = 0;
          continue;
        }
        sources_[source_]->document_text(doc_++, text_);
        pos_ = 0;
      }
    } catch (const std::exception& e) {
      error_ = e.what();
      status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal, error_);
      done_ = true;
    }
  }

  std::vector<std::unique_ptr<detail::TextDocumentSource>> sources_;
  size_t source_ = 0;
  int64_t doc_ = 0;
  std::string text_;  // the current document
  size_t pos_ = 0;    // next unread byte of text_
  std::string line_;
  bool done_ = false;
  std::string error_;
  sentencepiece::util::Status status_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

void train_sentencepiece(const SentencePieceTrainOptions& o) {
  if (o.inputs.empty()) throw std::runtime_error("--input: expected at least one glob of text files");
  if (o.vocab_size < 300) {
    throw std::runtime_error("--vocab-size: " + std::to_string(o.vocab_size) +
                             ", expected >= 300 (256 byte pieces, <unk>, <|eot|>, \"\\n\" and some merges)");
  }
  if (o.model_type != "bpe" && o.model_type != "unigram") {
    throw std::runtime_error("--model-type: \"" + o.model_type + "\", expected bpe or unigram");
  }
  const std::string suffix = ".model";
  if (o.out_model.size() <= suffix.size() ||
      o.out_model.compare(o.out_model.size() - suffix.size(), suffix.size(), suffix) != 0) {
    throw std::runtime_error("--out: \"" + o.out_model + "\", expected a path ending in .model");
  }
  if (o.max_sentences <= 0) throw std::runtime_error("max_sentences: expected > 0");

  std::vector<std::unique_ptr<detail::TextDocumentSource>> sources;
  for (size_t i = 0; i < o.inputs.size(); ++i) {
    SourceOptions so;
    so.exclude = o.exclude;
    so.separator = o.separator;
    so.text_field = o.text_field;
    so.key = "--input[" + std::to_string(i) + "]";
    sources.push_back(detail::open_text_documents(o.inputs[i], so));
  }
  LineIterator lines(std::move(sources));

  const std::unordered_map<std::string, std::string> args{
      {"model_prefix", o.out_model.substr(0, o.out_model.size() - suffix.size())},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"model_type", o.model_type},
      {"byte_fallback", "true"},
      {"user_defined_symbols", std::string(EOT_PIECE) + ",\n"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"input_sentence_size", std::to_string(o.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", "16384"},
      {"num_threads", "2"},
      {"minloglevel", "2"},
  };
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines);
  if (!lines.error().empty()) throw std::runtime_error(lines.error());
  if (!status.ok()) {
    throw std::runtime_error(o.out_model + ": SentencePiece training failed (" + status.ToString() + ")");
  }
}

}  // namespace trainer::data
