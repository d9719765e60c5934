#include "text/subword.h"

#include "core/error.h"
#include "text/files.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <charconv>
#include <iterator>
#include <limits>
#include <mutex>
#include <numeric>
#include <thread>
#include <unordered_map>

namespace mf::text {

class SubwordModel::Processor : public sentencepiece::SentencePieceProcessor {};

namespace {

/// Guards SentencePiece's process-wide seed (sentencepiece::SetRandomGeneratorSeed) from the moment it
/// is set until the generator it seeds has drawn from it.
std::mutex g_sentencepiece_seed;

/// Feeds SentencePiece's trainer from memory instead of a file, skipping empty sentences (it counts
/// each as a sentence of no characters).
class SentenceFeed : public sentencepiece::SentenceIterator {
 public:
  explicit SentenceFeed(const std::vector<std::string>& sentences) : sentences_(sentences) { skip_empty(); }
  bool done() const override { return next_ == sentences_.size(); }
  void Next() override {
    ++next_;
    skip_empty();
  }
  const std::string& value() const override { return sentences_[next_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void skip_empty() {
    while (next_ < sentences_.size() && sentences_[next_].empty()) ++next_;
  }
  const std::vector<std::string>& sentences_;
  size_t next_ = 0;
};

}  // namespace

SubwordModel SubwordModel::train(const std::vector<std::string>& sentences, const SubwordOptions& options) {
  MF_CHECK(options.vocab_size > kSpecialTokenCount,
           "subword model: vocab_size {} leaves no room beside the {} specials", options.vocab_size,
           kSpecialTokenCount);
  MF_CHECK(options.character_coverage > 0 && options.character_coverage <= 1,
           "subword model: character_coverage {} is not in (0, 1]", options.character_coverage);
  MF_CHECK(options.max_sentences > 0, "subword model: max_sentences must be positive, got {}", options.max_sentences);
  // The specials at miniflow's ids and spellings, so that the model file reads the same elsewhere.
  const std::unordered_map<std::string, std::string> arguments = {
      {"model_type", options.algorithm == SubwordAlgorithm::Bpe ? "bpe" : "unigram"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"byte_fallback", options.byte_fallback ? "true" : "false"},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"input_sentence_size", std::to_string(options.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"pad_id", std::to_string(kPadId)},
      {"bos_id", std::to_string(kSosId)},
      {"eos_id", std::to_string(kEosId)},
      {"unk_id", std::to_string(kUnkId)},
      {"pad_piece", std::string(kSpecialTokenTexts[kPadId])},
      {"bos_piece", std::string(kSpecialTokenTexts[kSosId])},
      {"eos_piece", std::string(kSpecialTokenTexts[kEosId])},
      {"unk_piece", std::string(kSpecialTokenTexts[kUnkId])},
      {"minloglevel", "2"},  // SentencePiece logs each training stage to stderr otherwise
  };
  SentenceFeed feed(sentences);
  MF_CHECK(!feed.done(), "subword model: no sentences to learn from");
  std::string bytes;
  // SentencePiece samples and shuffles with one process-wide generator, seeded from the system's
  // entropy unless told: without this, the same sentences would learn different models.
  std::lock_guard seed_lock(g_sentencepiece_seed);
  sentencepiece::SetRandomGeneratorSeed(options.seed);
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(arguments, &feed, &bytes);
  MF_CHECK(status.ok(), "subword model: SentencePiece could not learn a {}-piece {} model: {}", options.vocab_size,
           arguments.at("model_type"), status.ToString());
  return SubwordModel(std::move(bytes), "the model just learned");
}

SubwordModel SubwordModel::from_bytes(std::string bytes, std::string_view origin) {
  return SubwordModel(std::move(bytes), origin);
}

SubwordModel SubwordModel::load(const std::filesystem::path& path) {
  std::ifstream in = detail::open_input(path, "subword model");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MF_CHECK(!in.bad(), "subword model '{}' cannot be read", path.string());
  return SubwordModel(std::move(bytes), path.string());
}

SubwordModel::SubwordModel(std::string bytes, std::string_view origin) : bytes_(std::move(bytes)) {
  auto processor = std::make_shared<Processor>();
  const sentencepiece::util::Status status = processor->LoadFromSerializedProto(bytes_);
  MF_CHECK(status.ok(), "{} is not a SentencePiece model ({} bytes): {}", origin, bytes_.size(), status.ToString());
  const int sentencepiece_size = processor->GetPieceSize();
  // SentencePiece's own ids of miniflow's specials, by miniflow id; -1 where the model has none (a
  // model trained with SentencePiece's defaults has no <pad>).
  to_sentencepiece_ = {processor->pad_id(), processor->bos_id(), processor->eos_id(), processor->unk_id()};
  from_sentencepiece_.assign(static_cast<size_t>(sentencepiece_size), -1);
  pieces_.assign(kSpecialTokenTexts.begin(), kSpecialTokenTexts.end());
  for (int64_t special = 0; special < kSpecialTokenCount; ++special) {
    const int id = to_sentencepiece_[static_cast<size_t>(special)];
    if (id >= 0) from_sentencepiece_[static_cast<size_t>(id)] = special;
  }
  for (int id = 0; id < sentencepiece_size; ++id) {
    if (from_sentencepiece_[static_cast<size_t>(id)] >= 0) continue;
    from_sentencepiece_[static_cast<size_t>(id)] = static_cast<int64_t>(pieces_.size());
    to_sentencepiece_.push_back(id);
    pieces_.push_back(processor->IdToPiece(id));
    if (!processor->IsByte(id)) continue;
    byte_fallback_ = true;
    const std::string& text = pieces_.back();  // "<0x0A>"
    int byte = -1;
    MF_CHECK(text.size() == 6 && std::from_chars(text.data() + 3, text.data() + 5, byte, 16).ec == std::errc{},
             "{}: byte piece {} is not written <0xHH>", origin, text);
    if (byte < 0x20 || byte == 0x7F) control_character_ids_.push_back(static_cast<int64_t>(pieces_.size()) - 1);
  }
  processor_ = std::move(processor);
}

const std::string& SubwordModel::piece(int64_t id) const {
  MF_CHECK(id >= 0 && id < size(), "subword model: id {} is outside its {} pieces", id, size());
  return pieces_[static_cast<size_t>(id)];
}

std::vector<int64_t> SubwordModel::ids_by_frequency() const {
  std::vector<int64_t> ids(pieces_.size());
  std::iota(ids.begin(), ids.end(), int64_t{0});
  // SentencePiece numbers its byte pieces right after its specials, ahead of every learned piece.
  std::stable_partition(ids.begin() + kSpecialTokenCount, ids.end(), [&](int64_t id) {
    return !processor_->IsByte(to_sentencepiece_[static_cast<size_t>(id)]);
  });
  return ids;
}

std::vector<int64_t> SubwordModel::from_sentencepiece(std::span<const int> ids) const {
  std::vector<int64_t> out;
  out.reserve(ids.size());
  for (int id : ids) out.push_back(from_sentencepiece_[static_cast<size_t>(id)]);
  return out;
}

std::vector<int64_t> SubwordModel::encode(std::string_view text) const {
  std::vector<int> ids;
  const sentencepiece::util::Status status = processor_->Encode(text, &ids);
  MF_CHECK(status.ok(), "subword model: cannot encode '{}': {}", text, status.ToString());
  return from_sentencepiece(ids);
}

std::vector<std::vector<int64_t>> SubwordModel::sample_encode(std::span<const std::string> texts,
                                                              const SubwordSampling& sampling, uint32_t seed) const {
  MF_CHECK(sampling.alpha > 0, "subword sampling: alpha must be positive, got {}", sampling.alpha);
  MF_CHECK(sampling.nbest_size == -1 || sampling.nbest_size >= 2,
           "subword sampling: nbest_size must be -1 (every segmentation) or at least 2, got {}", sampling.nbest_size);
  MF_CHECK(sampling.nbest_size <= std::numeric_limits<int>::max(), "subword sampling: nbest_size {} is too large",
           sampling.nbest_size);
  std::vector<std::vector<int64_t>> out(texts.size());
  sentencepiece::util::Status status;
  size_t next = 0;  // the text being encoded: after an error, the one that failed
  // SentencePiece draws from a generator per thread, seeded from its process-wide seed when the thread
  // first draws: a thread of its own for each call, started after the seed is set, draws the same
  // numbers every time (a thread drawing twice would continue its stream instead).
  std::lock_guard seed_lock(g_sentencepiece_seed);
  // Its value 2^32 - 1 means "seed from the system's entropy".
  sentencepiece::SetRandomGeneratorSeed(std::min(seed, std::numeric_limits<uint32_t>::max() - 1));
  std::thread sampler([&] {
    std::vector<int> ids;
    for (; next < texts.size(); ++next) {
      status = processor_->SampleEncode(texts[next], static_cast<int>(sampling.nbest_size),
                                        static_cast<float>(sampling.alpha), &ids);
      if (!status.ok()) return;
      out[next] = from_sentencepiece(ids);
    }
  });
  sampler.join();
  MF_CHECK(status.ok(), "subword sampling: cannot encode '{}' (alpha {}, nbest_size {}): {}", texts[next],
           sampling.alpha, sampling.nbest_size, status.ToString());
  return out;
}

std::vector<std::string> SubwordModel::pieces(std::string_view text) const {
  std::vector<std::string> out;
  for (int64_t id : encode(text)) out.push_back(pieces_[static_cast<size_t>(id)]);
  return out;
}

std::string SubwordModel::decode(std::span<const int64_t> ids) const {
  std::vector<int> kept;
  kept.reserve(ids.size());
  for (int64_t id : ids) {
    MF_CHECK(id >= 0 && id < size(), "subword model: cannot decode id {}, outside its {} pieces", id, size());
    if (id == kEosId) break;
    if (id == kPadId || id == kSosId) continue;
    kept.push_back(to_sentencepiece_[static_cast<size_t>(id)]);
  }
  std::string text;
  const sentencepiece::util::Status status = processor_->Decode(kept, &text);
  MF_CHECK(status.ok(), "subword model: cannot decode {} ids: {}", kept.size(), status.ToString());
  return text;
}

std::vector<int64_t> SubwordModel::word_indices(std::span<const int64_t> ids) const {
  static constexpr std::string_view kWordBoundary = "\u2581";  // "▁", SentencePiece's space
  std::vector<int64_t> out(ids.size(), -1);
  std::vector<size_t> waiting;  // "▁" pieces since the last word, which belong to the next one
  int64_t word = -1;
  bool starts_word = true;  // the next piece with text begins a word
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string& text = piece(ids[i]);
    if (ids[i] == kEosId) break;
    if (ids[i] == kPadId || ids[i] == kSosId) continue;
    const bool unknown = ids[i] == kUnkId;
    std::string_view rest = text;
    while (rest.starts_with(kWordBoundary)) {
      rest.remove_prefix(kWordBoundary.size());
      starts_word = true;
    }
    if (rest.empty()) {
      waiting.push_back(i);
      continue;
    }
    if (starts_word || unknown || word < 0) ++word;
    starts_word = unknown;
    for (size_t j : waiting) out[j] = word;
    waiting.clear();
    out[i] = word;
  }
  return out;
}

}  // namespace mf::text
