// SubwordModel: SentencePiece models learned and loaded, with miniflow's specials at their ids. The
// expectations come from SentencePiece's documented behaviour (decode inverts encode on normalized
// text; byte fallback spells unseen characters as <0xNN> pieces; the default unk surface is " ⁇ "),
// not from miniflow's own output.
#include "text/subword.h"

#include "core/error.h"
#include "helpers.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

using namespace mf;
using namespace mf::text;
using mf::testing::split_words;

namespace {

/// A few hundred sentences in German and English with accents, CJK and punctuation, varied enough for
/// a vocabulary of a few hundred pieces.
const std::vector<std::string>& corpus() {
  static const std::vector<std::string> sentences = [] {
    const std::vector<std::string> subjects = {"Ein Mann", "Eine Frau", "Zwei Kinder", "Der Hund", "A man",
                                               "A woman", "Two children", "The dog", "Jürgen", "Zoë"};
    const std::vector<std::string> verbs = {"läuft über", "spielt auf", "sitzt neben", "runs across",
                                            "plays on", "sits next to", "schläft unter", "looks at"};
    const std::vector<std::string> objects = {"die Straße.", "dem Rasen!", "einem Baum?", "the street.",
                                              "a lawn, quickly.", "the tree (again).", "„Grüße“ aus 東京.",
                                              "a café's terrace — naïvely."};
    std::vector<std::string> out;
    for (const std::string& s : subjects)
      for (const std::string& v : verbs)
        for (const std::string& o : objects) out.push_back(s + " " + v + " " + o);
    return out;
  }();
  return sentences;
}

SubwordModel small_model(SubwordAlgorithm algorithm = SubwordAlgorithm::Unigram, bool byte_fallback = true) {
  return SubwordModel::train(corpus(), {.algorithm = algorithm, .vocab_size = byte_fallback ? 340 : 90,
                                        .byte_fallback = byte_fallback});
}

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("miniflow_test_subword_" + name);
}

}  // namespace

TEST_CASE("a learned subword model round-trips text, Unicode and punctuation included") {
  for (SubwordAlgorithm algorithm : {SubwordAlgorithm::Unigram, SubwordAlgorithm::Bpe}) {
    CAPTURE(static_cast<int>(algorithm));
    const SubwordModel model = small_model(algorithm);
    CHECK(model.size() == 340);
    for (size_t i = 0; i < corpus().size(); i += 37) {
      const std::string& sentence = corpus()[i];
      const std::vector<int64_t> ids = model.encode(sentence);
      CHECK(!ids.empty());
      CHECK(std::none_of(ids.begin(), ids.end(), [](int64_t id) { return id < kSpecialTokenCount; }));
      CHECK(model.decode(ids) == sentence);
    }
    // Subwords, not characters: a frequent word is one piece, marked as starting a word by "▁".
    CHECK(model.pieces("The dog").size() < std::string("The dog").size());
    CHECK(model.pieces("The dog").front().starts_with("\xE2\x96\x81"));
  }
}

TEST_CASE("miniflow's specials keep their ids, and decode skips pad and sos and stops at eos") {
  const SubwordModel model = small_model();
  for (int64_t id = 0; id < kSpecialTokenCount; ++id) CHECK(model.piece(id) == kSpecialTokenTexts[id]);
  std::vector<int64_t> ids = model.encode("A man plays on the street.");
  std::vector<int64_t> wrapped = {kSosId};
  wrapped.insert(wrapped.end(), ids.begin(), ids.end());
  wrapped.insert(wrapped.end(), {kEosId, ids.front(), kPadId});
  CHECK(model.decode(wrapped) == "A man plays on the street.");
  CHECK(model.encode("").empty());
  CHECK(model.decode(std::vector<int64_t>{}).empty());
  CHECK_THROWS_WITH_AS(model.decode(std::vector<int64_t>{model.size()}), doctest::Contains("outside its 340 pieces"),
                       Error);
  CHECK_THROWS_WITH_AS(model.piece(-1), doctest::Contains("id -1 is outside"), Error);
}

TEST_CASE("byte fallback spells unseen characters as bytes; without it they are <unk>") {
  const std::string unseen = "Жук 🙂 ß";  // Cyrillic, an emoji and ß: none is in the corpus
  const SubwordModel with_bytes = small_model();
  const std::vector<int64_t> ids = with_bytes.encode(unseen);
  CHECK(std::find(ids.begin(), ids.end(), kUnkId) == ids.end());
  CHECK(with_bytes.decode(ids) == unseen);
  const std::vector<std::string> pieces = with_bytes.pieces("🙂");
  CHECK(std::any_of(pieces.begin(), pieces.end(), [](const std::string& p) { return p == "<0xF0>"; }));

  const SubwordModel without = small_model(SubwordAlgorithm::Unigram, false);
  const std::vector<int64_t> unk_ids = without.encode("Жук");
  CHECK(std::find(unk_ids.begin(), unk_ids.end(), kUnkId) != unk_ids.end());
  CHECK(without.decode(unk_ids).find("\xE2\x81\x87") != std::string::npos);  // SentencePiece's " ⁇ "
}

TEST_CASE("control_character_ids: the byte pieces that decode to U+0000-U+001F or U+007F, and only those") {
  const SubwordModel model = small_model();
  const std::vector<int64_t> controls = model.control_character_ids();
  // Every id checked by what it decodes to: a control character has to be one byte, so a piece
  // that decodes to one byte below 0x20 or of 0x7F is one of them, whatever its name.
  std::vector<int64_t> expected;
  for (int64_t id = kSpecialTokenCount; id < model.size(); ++id) {
    const std::string text = model.decode(std::vector<int64_t>{id});
    if (text.size() == 1 && (static_cast<unsigned char>(text[0]) < 0x20 || text[0] == 0x7F)) expected.push_back(id);
  }
  CHECK(expected.size() == 33);  // 32 C0 controls and DEL
  CHECK(controls == expected);
  CHECK(model.decode(std::vector<int64_t>{controls[10]}) == "\n");
  CHECK(small_model(SubwordAlgorithm::Unigram, false).control_character_ids().empty());
}

TEST_CASE("ids_by_frequency: the specials, the learned pieces in SentencePiece's order, then the 256 byte pieces") {
  for (const SubwordAlgorithm algorithm : {SubwordAlgorithm::Unigram, SubwordAlgorithm::Bpe}) {
    const SubwordModel model = small_model(algorithm);
    const std::vector<int64_t> ranked = model.ids_by_frequency();
    REQUIRE(static_cast<int64_t>(ranked.size()) == model.size());
    // SentencePiece spells its byte pieces <0x00> ... <0xFF>, the bytes' values in order.
    auto is_byte_piece = [&](int64_t id) {
      const std::string& piece = model.piece(id);
      return piece.size() == 6 && piece.starts_with("<0x") && piece.back() == '>';
    };
    const size_t bytes_start = ranked.size() - 256;
    for (size_t rank = 0; rank < ranked.size(); ++rank) {
      CAPTURE(rank);
      if (rank < static_cast<size_t>(kSpecialTokenCount)) {
        CHECK(ranked[rank] == static_cast<int64_t>(rank));
      } else if (rank < bytes_start) {
        CHECK_FALSE(is_byte_piece(ranked[rank]));
        if (rank > static_cast<size_t>(kSpecialTokenCount)) CHECK(ranked[rank - 1] < ranked[rank]);
      } else {
        CHECK(model.piece(ranked[rank]) == fmt::format("<0x{:02X}>", rank - bytes_start));
      }
    }
  }
  // Without byte fallback there is nothing to move: id order.
  const std::vector<int64_t> ranked = small_model(SubwordAlgorithm::Unigram, false).ids_by_frequency();
  for (size_t rank = 0; rank < ranked.size(); ++rank) CHECK(ranked[rank] == static_cast<int64_t>(rank));
}

TEST_CASE("a model's bytes load back into the same model, from memory and from a file") {
  const SubwordModel model = small_model();
  const SubwordModel again = SubwordModel::from_bytes(model.bytes(), "a copy");
  CHECK(again == model);
  const std::string sentence = "Zoë sitzt neben einem Baum?";
  CHECK(again.encode(sentence) == model.encode(sentence));
  const std::filesystem::path path = temp_path("roundtrip.model");
  std::ofstream(path, std::ios::binary) << model.bytes();
  CHECK(SubwordModel::load(path).encode(sentence) == model.encode(sentence));
  std::filesystem::remove(path);
  // The same sentences and options learn the same model, byte for byte.
  CHECK(small_model() == model);
}

TEST_CASE("a model trained with SentencePiece's own defaults has its specials mapped onto miniflow's ids") {
  // spm_train's defaults: <unk> 0, <s> 1, </s> 2, no <pad>.
  std::string bytes;
  struct Feed : sentencepiece::SentenceIterator {
    size_t next = 0;
    bool done() const override { return next == corpus().size(); }
    void Next() override { ++next; }
    const std::string& value() const override { return corpus()[next]; }
    sentencepiece::util::Status status() const override { return {}; }
  } feed;
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(
      std::unordered_map<std::string, std::string>{{"vocab_size", "100"}, {"minloglevel", "2"}}, &feed, &bytes);
  REQUIRE_MESSAGE(status.ok(), status.ToString());
  const SubwordModel model = SubwordModel::from_bytes(bytes, "spm defaults");
  CHECK(model.size() == 101);  // its 100 pieces and miniflow's <pad>
  for (int64_t id = 0; id < kSpecialTokenCount; ++id) CHECK(model.piece(id) == kSpecialTokenTexts[id]);
  const std::string sentence = "Der Hund läuft über die Straße.";
  const std::vector<int64_t> ids = model.encode(sentence);
  CHECK(std::none_of(ids.begin(), ids.end(), [](int64_t id) { return id < kSpecialTokenCount; }));
  CHECK(model.decode(ids) == sentence);
}

TEST_CASE("corrupt model bytes and impossible options are refused, naming what was wrong") {
  CHECK_THROWS_WITH_AS(SubwordModel::from_bytes("not a model", "checkpoint 'x.safetensors'"),
                       doctest::Contains("checkpoint 'x.safetensors' is not a SentencePiece model"), Error);
  const SubwordModel model = small_model();
  CHECK_THROWS_WITH_AS(SubwordModel::from_bytes(model.bytes().substr(0, model.bytes().size() / 2), "half a model"),
                       doctest::Contains("half a model is not a SentencePiece model"), Error);
  CHECK_THROWS_WITH_AS(SubwordModel::load(temp_path("missing.model")), doctest::Contains("does not exist"), Error);
  CHECK_THROWS_WITH_AS(SubwordModel::train(corpus(), {.vocab_size = 100000}),
                       doctest::Contains("could not learn a 100000-piece unigram model"), Error);
  CHECK_THROWS_WITH_AS(SubwordModel::train(corpus(), {.vocab_size = 4}), doctest::Contains("leaves no room"), Error);
  CHECK_THROWS_WITH_AS(SubwordModel::train({"", ""}, {}), doctest::Contains("no sentences"), Error);
}

TEST_CASE("sample_encode: sampled segmentations spell the text, and depend on the seed alone") {
  for (SubwordAlgorithm algorithm : {SubwordAlgorithm::Unigram, SubwordAlgorithm::Bpe}) {
    CAPTURE(static_cast<int>(algorithm));
    const SubwordModel model = small_model(algorithm);
    const SubwordSampling sampling{.alpha = algorithm == SubwordAlgorithm::Bpe ? 0.3 : 0.2};
    const std::vector<std::vector<int64_t>> sampled = model.sample_encode(corpus(), sampling, 7);
    REQUIRE(sampled.size() == corpus().size());
    size_t unlike_best = 0;
    for (size_t i = 0; i < corpus().size(); ++i) {
      CHECK(model.decode(sampled[i]) == corpus()[i]);
      CHECK(std::none_of(sampled[i].begin(), sampled[i].end(), [](int64_t id) { return id < kSpecialTokenCount; }));
      unlike_best += sampled[i] != model.encode(corpus()[i]);
    }
    CHECK(unlike_best > corpus().size() / 2);
    // The same seed draws the same segmentations, in this thread or another; another seed others.
    CHECK(model.sample_encode(corpus(), sampling, 7) == sampled);
    std::vector<std::vector<int64_t>> elsewhere;
    std::thread([&] { elsewhere = model.sample_encode(corpus(), sampling, 7); }).join();
    CHECK(elsewhere == sampled);
    const std::vector<std::vector<int64_t>> reseeded = model.sample_encode(corpus(), sampling, 8);
    size_t unlike_seed_7 = 0;
    for (size_t i = 0; i < corpus().size(); ++i) unlike_seed_7 += reseeded[i] != sampled[i];
    CHECK(unlike_seed_7 > corpus().size() / 2);
  }
}

TEST_CASE("sample_encode on a unigram model draws segmentations with probability P^alpha, as Kudo (2018) defines") {
  // The reference: every segmentation of one word into pieces of the vocabulary, enumerated here, with
  // probability proportional to exp(alpha * sum of its pieces' log-probabilities) (the model's scores,
  // read with SentencePiece's own API); nbest_size k keeps the k most probable. 20,000 draws of the
  // word: each frequency is within 4 standard deviations (sqrt(p (1 - p) / n) <= 0.0036) of its p.
  const SubwordModel model = small_model();
  sentencepiece::SentencePieceProcessor scores;
  REQUIRE(scores.LoadFromSerializedProto(model.bytes()).ok());
  // "street" as SentencePiece sees it, "▁street"; the small model has ▁, ▁s, s, t, r, e and tree.
  const std::vector<std::string> characters = {"\xE2\x96\x81", "s", "t", "r", "e", "e", "t"};
  std::map<std::vector<std::string>, double> weight;  // segmentation -> exp(alpha * log-probability)
  const double alpha = 0.3;
  for (unsigned cuts = 0; cuts < (1u << (characters.size() - 1)); ++cuts) {
    std::vector<std::string> pieces = {characters[0]};
    for (size_t c = 1; c < characters.size(); ++c) {
      if (cuts & (1u << (c - 1)))
        pieces.push_back(characters[c]);
      else
        pieces.back() += characters[c];
    }
    double log_p = 0;
    bool in_vocabulary = true;
    for (const std::string& piece : pieces) {
      const int id = scores.PieceToId(piece);
      in_vocabulary = in_vocabulary && id != scores.unk_id();
      log_p += scores.GetScore(id);
    }
    if (in_vocabulary) weight[pieces] = std::exp(alpha * log_p);
  }
  REQUIRE(weight.size() >= 4);
  const std::vector<std::string> texts(20000, "street");
  for (int64_t nbest : {int64_t{-1}, int64_t{2}}) {
    CAPTURE(nbest);
    std::map<std::vector<std::string>, double> expected = weight;
    if (nbest == 2) {  // the two most probable
      std::vector<std::pair<double, std::vector<std::string>>> ranked;
      for (const auto& [pieces, w] : weight) ranked.emplace_back(w, pieces);
      std::sort(ranked.rbegin(), ranked.rend());
      expected = {{ranked[0].second, ranked[0].first}, {ranked[1].second, ranked[1].first}};
    }
    double total = 0;
    for (const auto& [pieces, w] : expected) total += w;
    std::map<std::vector<std::string>, double> seen;
    for (const std::vector<int64_t>& ids : model.sample_encode(texts, {.alpha = alpha, .nbest_size = nbest}, 3)) {
      std::vector<std::string> pieces;
      for (int64_t id : ids) pieces.push_back(model.piece(id));
      seen[pieces] += 1.0 / static_cast<double>(texts.size());
    }
    for (const auto& [pieces, frequency] : seen) CHECK(expected.count(pieces) == 1);
    for (const auto& [pieces, w] : expected) {
      std::string spelled;
      for (const std::string& piece : pieces) spelled += piece + " ";
      CAPTURE(spelled);
      CHECK(std::abs(seen[pieces] - w / total) < 0.015);
    }
  }
  CHECK_THROWS_WITH_AS(model.sample_encode(texts, {.alpha = 0}, 1), "subword sampling: alpha must be positive, got 0",
                       Error);
  for (int64_t nbest : {int64_t{0}, int64_t{1}, int64_t{-2}})
    CHECK_THROWS_WITH_AS(model.sample_encode(texts, {.alpha = 0.5, .nbest_size = nbest}, 1),
                         doctest::Contains("nbest_size must be -1 (every segmentation) or at least 2"), Error);
}

TEST_CASE("word_indices groups each word's pieces as the decoded text's spaces separate them") {
  // The reference is the decoded text itself: word w of decode(ids), split at spaces, must be what
  // decoding the ids given index w alone prints, and every word must be covered.
  const std::vector<std::string> sentences = {corpus()[0], corpus()[123], corpus()[555], "Jürgen (again) — naïvely!",
                                              "  Zwei   Kinder  ", "Жук 🙂 ß schläft", "東京", "", "a"};
  for (const SubwordModel& model : {small_model(SubwordAlgorithm::Unigram), small_model(SubwordAlgorithm::Bpe),
                                    small_model(SubwordAlgorithm::Unigram, false)}) {
    CAPTURE(model.byte_fallback());
    for (const std::string& sentence : sentences) {
      CAPTURE(sentence);
      const std::vector<int64_t> ids = model.encode(sentence);
      const std::vector<int64_t> indices = model.word_indices(ids);
      const std::vector<std::string> words = split_words(model.decode(ids));
      REQUIRE(indices.size() == ids.size());
      CHECK(std::is_sorted(indices.begin(), indices.end()));
      const int64_t last = indices.empty() ? -1 : indices.back();
      CHECK(last + 1 == static_cast<int64_t>(words.size()));
      for (int64_t w = 0; w < static_cast<int64_t>(words.size()); ++w) {
        std::vector<int64_t> pieces;
        for (size_t i = 0; i < ids.size(); ++i)
          if (indices[i] == w) pieces.push_back(ids[i]);
        CHECK(split_words(model.decode(pieces)) == std::vector<std::string>{words[static_cast<size_t>(w)]});
      }
    }
  }
}

TEST_CASE("word_indices: specials spell no word, <unk> is a word of its own, a lone ▁ joins the next word") {
  const SubwordModel model = small_model(SubwordAlgorithm::Unigram, false);
  const std::vector<int64_t> man = model.encode("man");  // "▁man", or "▁" and "man"
  std::vector<int64_t> ids = {kSosId};
  ids.insert(ids.end(), man.begin(), man.end());
  ids.insert(ids.end(), {kUnkId, kPadId});
  ids.insert(ids.end(), man.begin(), man.end());
  ids.insert(ids.end(), {kEosId, man.front()});
  std::vector<int64_t> expected = {-1};
  expected.insert(expected.end(), man.size(), 0);
  expected.insert(expected.end(), {1, -1});
  expected.insert(expected.end(), man.size(), 2);
  expected.insert(expected.end(), {-1, -1});
  CHECK(model.word_indices(ids) == expected);
  CHECK(split_words(model.decode(ids)) == std::vector<std::string>{"man", "\xE2\x81\x87", "man"});

  // Pieces made of "▁" alone: found in the vocabulary, they wait for the word after them, and spell no
  // word when none comes.
  int64_t space = -1, ab = -1;  // "▁", and a piece without it
  for (int64_t id = kSpecialTokenCount; id < model.size(); ++id) {
    if (model.piece(id) == "\xE2\x96\x81") space = id;
    if (ab < 0 && !model.piece(id).starts_with("\xE2\x96\x81")) ab = id;
  }
  REQUIRE(space >= 0);
  REQUIRE(ab >= 0);
  CHECK(model.word_indices(std::vector<int64_t>{space, space, ab, space}) == std::vector<int64_t>{0, 0, 0, -1});
  CHECK(model.word_indices(std::vector<int64_t>{ab, ab, space, ab}) == std::vector<int64_t>{0, 0, 1, 1});
}
