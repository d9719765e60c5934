// Translator: batches, the checkpoint round trip, and the errors for checkpoints that do not fit.
#include <doctest/doctest.h>

#include "helpers.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <map>

using namespace mf;

namespace {

models::Translator toy_translator() {
  manual_seed(3);
  text::Corpus corpus = text::make_corpus({{"ich mochte ein bier", "i want a beer"},
                                               {"ich mochte ein cola", "i want a coke"}});
  text::TokenCounts src_counts, tgt_counts;
  text::count_tokens(corpus.sources, src_counts);
  text::count_tokens(corpus.targets, tgt_counts);
  text::Vocab src = text::Vocab::build(src_counts), tgt = text::Vocab::build(tgt_counts);
  models::TransformerConfig config{.src_vocab = src.size(), .tgt_vocab = tgt.size(), .d_model = 16, .heads = 2,
                                   .encoder_layers = 1, .decoder_layers = 1, .d_ff = 32, .dropout = 0.0,
                                   .max_len = 12, .shared_embeddings = false};
  return models::Translator(config, src, tgt, {});
}

/// An untrained translator with one SentencePiece vocabulary (byte fallback) for both sides, in eval mode.
models::Translator subword_translator(uint64_t seed) {
  std::vector<std::string> text;
  for (const char* s : {"Ein Mann läuft.", "A man runs.", "Eine Frau schläft.", "A woman sleeps.", "Zwei Hunde.",
                        "Two dogs."})
    for (int i = 0; i < 20; ++i) text.emplace_back(s);
  const text::TextCodec both(text::SubwordModel::train(text, {.vocab_size = 290}));
  manual_seed(seed);
  const models::TransformerConfig config{.src_vocab = both.size(), .tgt_vocab = both.size(), .d_model = 16,
                                         .heads = 2, .encoder_layers = 1, .decoder_layers = 2, .d_ff = 32,
                                         .dropout = 0.0, .max_len = 24, .shared_embeddings = true};
  models::Translator translator(config, both, both);
  translator.model().eval();
  return translator;
}

std::filesystem::path temp_file(const char* name) { return std::filesystem::temp_directory_path() / name; }

/// Makes `favoured` every decoding step's first choices and <eos> its last, so that they fill the
/// translations: the decoder's last norm (`last_norm`) gives every position the state (1, ..., 1), the
/// output rows (`output_rows`, [V, 16]) of the favoured tokens are (5, ..., 5), logits of 80 against a
/// few, and <eos>'s row is (-5, ..., -5).
void favour_tokens(models::Translator& translator, const std::string& last_norm, const std::string& output_rows,
                   const std::vector<int64_t>& favoured) {
  NoGradGuard no_grad;
  std::map<std::string, Tensor> parameters;
  for (const nn::NamedTensor& p : translator.model().named_parameters()) parameters[p.name] = p.tensor;
  parameters.at(last_norm + ".weight").fill_(0.0);
  parameters.at(last_norm + ".bias").fill_(1.0);
  for (int64_t token : favoured) parameters.at(output_rows).narrow(0, token, 1).fill_(5.0);
  parameters.at(output_rows).narrow(0, text::kEosId, 1).fill_(-5.0);
}

/// The first token decoding `sentence` takes with no token banned.
int64_t first_token_without_bans(models::Translator& translator, const std::string& sentence) {
  const auto found = models::decode_sources(translator.model(), {translator.source().encode(sentence)},
                                            {.max_new_tokens = 4});
  REQUIRE(!found.front().front().tokens.empty());
  return found.front().front().tokens.front();
}

/// Translator::translate's translations of `sentence` in at most 4 tokens: greedy, and beam 3's 3 best.
std::vector<models::Translation> short_translations(models::Translator& translator, const std::string& sentence) {
  std::vector<models::Translation> all;
  for (int64_t beam : {1, 3}) {
    auto found = translator.translate({sentence}, {.beam_size = beam, .max_new_tokens = 4, .nbest = beam});
    std::move(found.at(0).begin(), found.at(0).end(), std::back_inserter(all));
  }
  return all;
}

}  // namespace

TEST_CASE("a batch is source + <eos>, <sos> + target, target + <eos>, padded with 0") {
  std::vector<std::vector<int64_t>> sources{{5, 6, 7}, {8}}, targets{{9}, {10, 11}};
  std::vector<int64_t> order{1, 0};
  models::TranslationBatch batch = models::make_translation_batch(sources, targets, order);
  CHECK(batch.src.to_vector<int64_t>() == std::vector<int64_t>{8, 2, 0, 0, 5, 6, 7, 2});
  CHECK(batch.tgt_in.to_vector<int64_t>() == std::vector<int64_t>{1, 10, 11, 1, 9, 0});
  CHECK(batch.tgt_out.to_vector<int64_t>() == std::vector<int64_t>{10, 11, 2, 9, 2, 0});
  CHECK(batch.target_tokens == 5);
}

TEST_CASE("a saved translator translates exactly as before after loading") {
  models::Translator translator = toy_translator();
  translator.model().eval();
  std::vector<std::string> sentences{"ich mochte ein bier", "Ich mochte ein COLA !", "unbekannt"};
  std::vector<std::string> before = translator.translate_greedy(sentences, 6);
  auto beams_before = translator.translate(sentences, {.beam_size = 3, .max_new_tokens = 6, .nbest = 2});
  std::filesystem::path path = temp_file("miniflow_test_translator.safetensors");
  translator.save(path, {}, {{"epoch", "1"}});
  models::Translator loaded = models::Translator::load(path);
  std::filesystem::remove(path);
  CHECK(loaded.translate_greedy(sentences, 6) == before);
  auto beams_after = loaded.translate(sentences, {.beam_size = 3, .max_new_tokens = 6, .nbest = 2});
  REQUIRE(beams_after.size() == beams_before.size());
  for (size_t s = 0; s < beams_after.size(); ++s) CHECK(beams_after[s] == beams_before[s]);
  CHECK(loaded.source() == translator.source());
  CHECK(loaded.target() == translator.target());
  CHECK(loaded.model().config().to_json() == translator.model().config().to_json());
}

TEST_CASE("an int8 translator saves int8 weights and loads back quantized, translating exactly as before") {
  models::Translator translator = toy_translator();
  translator.model().eval();
  CHECK(!translator.is_quantized());
  translator.quantize_int8();
  CHECK(translator.is_quantized());
  std::vector<std::string> sentences{"ich mochte ein bier", "Ich mochte ein COLA !", "unbekannt"};
  std::vector<std::string> before = translator.translate_greedy(sentences, 6);
  auto beams_before = translator.translate(sentences, {.beam_size = 3, .max_new_tokens = 6, .nbest = 2});
  std::filesystem::path path = temp_file("miniflow_test_translator_int8.safetensors");
  translator.save(path);
  nn::TensorFile file = nn::load_tensors(path);
  int64_t int8_tensors = 0;
  for (const nn::NamedTensor& t : file.tensors) int8_tensors += t.tensor.dtype() == DType::Int8;
  CHECK(int8_tensors == 2 + 6 + 10);  // two embeddings, the encoder's 6 Linear layers, the decoder's 10
  models::Translator loaded = models::Translator::load(path);
  std::filesystem::remove(path);
  CHECK(loaded.is_quantized());
  CHECK(loaded.translate_greedy(sentences, 6) == before);
  auto beams_after = loaded.translate(sentences, {.beam_size = 3, .max_new_tokens = 6, .nbest = 2});
  REQUIRE(beams_after.size() == beams_before.size());
  for (size_t s = 0; s < beams_after.size(); ++s) CHECK(beams_after[s] == beams_before[s]);
}

TEST_CASE("checkpoints that are not translators, or do not fit their config, are refused by name") {
  std::filesystem::path path = temp_file("miniflow_test_translator_bad.safetensors");
  nn::save_tensors(path, {{"x", zeros({2})}});
  CHECK_THROWS_WITH_AS(models::Translator::load(path), doctest::Contains("is not a miniflow translation checkpoint"),
                       Error);
  models::Translator translator = toy_translator();
  translator.save(path);
  nn::TensorFile file = nn::load_tensors(path);
  models::TransformerConfig other = models::TransformerConfig::from_json(file.metadata.at("translation.config"));
  other.d_ff = 64;  // a config from another run, with the same vocabularies
  file.metadata["translation.config"] = other.to_json();
  nn::save_tensors(path, file.tensors, file.metadata);
  CHECK_THROWS_WITH_AS(models::Translator::load(path), doctest::Contains("does not fit its own config"), Error);
  CHECK_THROWS_WITH_AS(models::Translator::load(path),
                       doctest::Contains("mismatched: encoder.layers.0.ffn.linear1.weight"), Error);
  std::filesystem::remove(path);
}

TEST_CASE("a checkpoint whose config asks for a far bigger model is refused before building it") {
  // Found with fuzz_checkpoint: a config edited to d_model 2^30, 10^8 encoder layers or max_len 10^8
  // made Translator::load allocate gigabytes (or run for minutes) before any check could fail.
  std::filesystem::path path = temp_file("miniflow_test_translator_big.safetensors");
  models::Translator translator = toy_translator();
  translator.save(path);
  const nn::TensorFile saved = nn::load_tensors(path);
  const models::TransformerConfig config = translator.model().config();
  auto save_with = [&](const models::TransformerConfig& other) {
    nn::TensorFile file = saved;
    file.metadata["translation.config"] = other.to_json();
    nn::save_tensors(path, file.tensors, file.metadata);
  };
  models::TransformerConfig wide = config, deep = config, long_positions = config;
  wide.d_model = int64_t{1} << 20;
  deep.encoder_layers = 100'000'000;
  for (const models::TransformerConfig& big : {wide, deep}) {
    CAPTURE(big.to_json());
    save_with(big);
    const std::string message = fmt::format(
        "checkpoint '{}' does not fit its own config: its config describes a model of {} parameters, over 2 times "
        "the {} its tensors hold",
        path.string(), big.parameter_count(), config.parameter_count());
    CHECK_THROWS_WITH_AS(models::Translator::load(path), message.c_str(), Error);
  }
  long_positions.max_len = 100'000'000;  // the positional table is built, but not stored
  save_with(long_positions);
  CHECK_THROWS_WITH_AS(models::Translator::load(path),
                       doctest::Contains("max_len 100000000 is over the limit of 65536 positions"), Error);
  std::filesystem::remove(path);
}

TEST_CASE("averaging checkpoints: N copies give the model back, two give their element-wise mean") {
  models::Translator first = toy_translator();
  manual_seed(4);  // a second initialisation of the same model: other weights
  models::Translator second(first.model().config(), first.source(), first.target());
  const std::filesystem::path a = temp_file("miniflow_test_average_a.safetensors"),
                              b = temp_file("miniflow_test_average_b.safetensors");
  first.save(a);
  second.save(b);
  const nn::StateDict first_state = first.model().state_dict(), second_state = second.model().state_dict();

  // x + x + x = 3x exactly in float64 for a float32 x, and 3x / 3 = x: the copies' mean is x bit for bit.
  const nn::StateDict same = models::Translator::average({a, a, a}).model().state_dict();
  REQUIRE(same.size() == first_state.size());
  for (size_t i = 0; i < same.size(); ++i) {
    CAPTURE(same[i].name);
    CHECK(same[i].tensor.to_vector<float>() == first_state[i].tensor.to_vector<float>());
  }
  // The mean, worked out here in double from the two models' own weights.
  const nn::StateDict mean = models::Translator::average({a, b}).model().state_dict();
  for (size_t i = 0; i < mean.size(); ++i) {
    CAPTURE(mean[i].name);
    const std::vector<float> x = first_state[i].tensor.to_vector<float>(),
                             y = second_state[i].tensor.to_vector<float>(), got = mean[i].tensor.to_vector<float>();
    for (size_t k = 0; k < got.size(); ++k)
      CHECK(got[k] == static_cast<float>((static_cast<double>(x[k]) + static_cast<double>(y[k])) / 2));
  }

  models::TransformerConfig wider = first.model().config();
  wider.d_ff = 64;
  const std::filesystem::path c = temp_file("miniflow_test_average_c.safetensors");
  models::Translator(wider, first.source(), first.target()).save(c);
  const std::string expected = fmt::format("'{}' has another model config than '{}'", c.string(), a.string());
  CHECK_THROWS_WITH_AS(models::Translator::average({a, c}), doctest::Contains(expected.c_str()), Error);
  CHECK_THROWS_WITH_AS(models::Translator::average({}), doctest::Contains("no checkpoint given"), Error);
  for (const auto& path : {a, b, c}) std::filesystem::remove(path);
}

TEST_CASE("checkpoints written before text codecs (word vocabularies under their own keys) still load") {
  models::Translator translator = toy_translator();
  translator.model().eval();
  const std::filesystem::path path = temp_file("miniflow_test_translator_old.safetensors");
  translator.save(path);
  nn::TensorFile file = nn::load_tensors(path);
  // The keys as save() wrote them until the subword models came.
  file.metadata.erase("translation.source");
  file.metadata.erase("translation.target");
  file.metadata["translation.src_vocab"] = translator.source().words()->to_json();
  file.metadata["translation.tgt_vocab"] = translator.target().words()->to_json();
  file.metadata["translation.tokenizer"] = R"({"lowercase": true, "split_punctuation": true})";
  nn::save_tensors(path, file.tensors, file.metadata);
  models::Translator loaded = models::Translator::load(path);
  std::filesystem::remove(path);
  CHECK(loaded.source() == translator.source());
  CHECK(loaded.target() == translator.target());
  const std::vector<std::string> sentences{"ich mochte ein bier", "unbekannt"};
  CHECK(loaded.translate_greedy(sentences, 6) == translator.translate_greedy(sentences, 6));
}

TEST_CASE("a subword translator: one shared vocabulary and embedding, stored in and loaded from its checkpoint") {
  models::Translator translator = subword_translator(5);
  const text::TextCodec both = translator.source();
  // Untrained, it translates into some pieces; what matters is that the loaded copy gives the same text.
  const std::vector<std::string> sentences{"Ein Mann läuft.", "Жук 🙂"};
  const std::vector<std::string> before = translator.translate_greedy(sentences, 8);
  const std::filesystem::path path = temp_file("miniflow_test_translator_subword.safetensors");
  translator.save(path);
  nn::TensorFile file = nn::load_tensors(path);
  CHECK(file.metadata.at("translation.target") == R"({"kind":"same as source"})");  // the model's bytes once
  models::Translator loaded = models::Translator::load(path);
  CHECK(loaded.source() == both);
  CHECK(loaded.target() == both);
  CHECK(loaded.model().config().shared_embeddings);
  CHECK(loaded.translate_greedy(sentences, 8) == before);
  // The source side never meets <unk>: byte fallback spells the unseen characters.
  const std::vector<int64_t> ids = loaded.source().encode("Жук 🙂");
  CHECK(std::find(ids.begin(), ids.end(), text::kUnkId) == ids.end());

  // A subword model whose bytes were damaged is refused, naming the checkpoint and the side.
  nlohmann::json source = nlohmann::json::parse(file.metadata.at("translation.source"));
  std::string model = source["model"];
  source["model"] = model.substr(0, model.size() / 8 * 4);  // whole base64 groups: valid base64, half a model
  file.metadata["translation.source"] = source.dump();
  nn::save_tensors(path, file.tensors, file.metadata);
  const std::string expected =
      "checkpoint '" + path.string() + "' (source) (subword model) is not a SentencePiece model";
  CHECK_THROWS_WITH_AS(models::Translator::load(path), doctest::Contains(expected.c_str()), Error);
  source["model"] = "not base64!";
  file.metadata["translation.source"] = source.dump();
  nn::save_tensors(path, file.tensors, file.metadata);
  CHECK_THROWS_WITH_AS(models::Translator::load(path), doctest::Contains("is not base64"), Error);
  source["kind"] = "wordpiece";
  file.metadata["translation.source"] = source.dump();
  nn::save_tensors(path, file.tensors, file.metadata);
  CHECK_THROWS_WITH_AS(models::Translator::load(path), doctest::Contains("unknown text codec kind 'wordpiece'"), Error);
  std::filesystem::remove(path);
}

TEST_CASE("an ensemble translator: members of other architectures decode beside it, other vocabularies are refused") {
  models::Translator first = toy_translator();
  models::TransformerConfig wider = first.model().config();
  wider.d_ff = 64;
  wider.decoder_layers = 2;
  manual_seed(5);
  models::Translator second(wider, first.source(), first.target());
  const std::vector<std::string> sentences = {"ich mochte ein bier", "ein cola"};
  const std::vector<std::string> targets = {"i want a beer", "a coke"};
  const models::DecodingOptions options{.beam_size = 2, .nbest = 2};

  // What the library's ensemble functions give for the two models is what the translator gives.
  std::vector<std::vector<int64_t>> source_ids, target_ids;
  for (const std::string& s : sentences) source_ids.push_back(first.source().encode(s));
  for (const std::string& t : targets) target_ids.push_back(first.target().encode(t));
  const models::Ensemble both{&first.model(), &second.model()};
  models::DecodingOptions banned = options;  // the untrained models would generate <pad> and <sos>
  banned.banned_ids = first.banned_tokens();
  const auto expected = models::decode_sources(both, source_ids, banned);
  const auto expected_scores = models::score_targets(both, source_ids, target_ids);

  first.add_ensemble_member(std::move(second));
  CHECK(first.models().size() == 2);
  const auto translations = first.translate(sentences, options);
  const auto scores = first.score(sentences, targets);
  REQUIRE(translations.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    REQUIRE(translations[i].size() == expected[i].size());
    for (size_t k = 0; k < expected[i].size(); ++k) {
      CHECK(translations[i][k].text == first.decode_target(expected[i][k].tokens));
      CHECK(translations[i][k].score == expected[i][k].score);
    }
    CHECK(scores[i].log_prob == expected_scores[i].log_prob);
  }

  text::Vocab other_target = text::Vocab::build({{"i", 1}, {"want", 1}, {"tea", 1}});
  models::TransformerConfig config = first.model().config();
  config.tgt_vocab = other_target.size();
  models::Translator other(config, first.source(), text::TextCodec(other_target, {}));
  CHECK_THROWS_WITH_AS(first.add_ensemble_member(std::move(other)),
                       "an ensemble member must have the same vocabularies as the first model: its target side differs",
                       Error);
}

TEST_CASE("Translator::align: each translation's words against its source's, as spaces separate them") {
  models::Translator translator = subword_translator(5);
  // Untrained, it translates into arbitrary pieces, some of them "▁" alone or bytes: the words are
  // still those of the printed text.
  const std::vector<std::string> sentences{"Ein Mann läuft.", "Zwei   Hunde schlafen!", "Жук 🙂", "A"};
  const auto translations = translator.translate(sentences, {.beam_size = 3, .max_new_tokens = 12, .nbest = 3});
  std::vector<std::string> sources;
  std::vector<std::vector<int64_t>> targets;
  std::vector<std::string> texts;
  for (size_t i = 0; i < sentences.size(); ++i) {
    for (const models::Translation& t : translations[i]) {
      CHECK(translator.decode_target(t.ids) == t.text);
      CHECK(t.tokens() == static_cast<int64_t>(t.ids.size()));
      sources.push_back(sentences[i]);
      targets.push_back(t.ids);
      texts.push_back(t.text);
    }
  }
  const std::vector<models::WordAlignment> alignments = translator.align(sources, targets);
  REQUIRE(alignments.size() == sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    CAPTURE(sources[i]);
    CAPTURE(texts[i]);
    const models::WordAlignment& a = alignments[i];
    CHECK(a.source_words == static_cast<int64_t>(testing::split_words(sources[i]).size()));
    CHECK(a.target_words == static_cast<int64_t>(testing::split_words(texts[i]).size()));
    for (int64_t t = 0; t < a.target_words; ++t) {
      double row = 0;
      for (int64_t w = 0; w < a.source_words; ++w) {
        CHECK(a.weight(t, w) >= 0);
        row += a.weight(t, w);
      }
      CHECK(row <= 1 + 1e-6);  // what went to <eos> is left out
    }
    CHECK(a.hard().size() == static_cast<size_t>(a.target_words));
  }
  // The default layer is the last; under an ensemble, the alignment is still model()'s alone.
  const auto last = translator.align(sources, targets, 2);
  const auto first = translator.align(sources, targets, 1, {.batch_tokens = 16});
  CHECK(last.front().weights == alignments.front().weights);
  CHECK(first.front().weights != alignments.front().weights);
  translator.add_ensemble_member(subword_translator(6));
  CHECK(translator.align(sources, targets).front().weights == alignments.front().weights);
}


TEST_CASE("a Translator never generates <pad> or <sos>, even from a model that favours them") {
  manual_seed(3);
  text::Vocab vocab = text::Vocab::build({{"i", 5}, {"want", 5}, {"a", 5}, {"beer", 5}});
  models::TransformerConfig config{.src_vocab = vocab.size(), .tgt_vocab = vocab.size(), .d_model = 16, .heads = 2,
                                   .encoder_layers = 1, .decoder_layers = 1, .d_ff = 32, .dropout = 0.0,
                                   .max_len = 12, .shared_embeddings = false, .tie_output = false};
  models::Translator translator(config, vocab, vocab, {});
  translator.model().eval();
  favour_tokens(translator, "decoder.layers.0.norm3", "output_proj.weight", {text::kPadId, text::kSosId});
  CHECK(first_token_without_bans(translator, "i want a beer") <= text::kSosId);  // what banning them prevents
  for (const models::Translation& t : short_translations(translator, "i want a beer")) {
    CHECK(t.tokens() > 0);
    for (int64_t id : t.ids) CHECK(id > text::kSosId);
  }
  CHECK(translator.banned_tokens() == std::vector<int64_t>{text::kPadId, text::kSosId});  // words: <unk> allowed
}

TEST_CASE("a Translator never generates a control character, even from a model that favours the newline byte") {
  models::Translator translator = subword_translator(5);
  const std::vector<int64_t> controls = translator.target().control_character_ids();
  REQUIRE(controls.size() == 33);
  const int64_t newline = controls[10];
  REQUIRE(translator.decode_target(std::vector<int64_t>{newline}) == "\n");
  favour_tokens(translator, "decoder.layers.1.norm3", "embed.weight", {newline});  // tied: the embedding's rows
  CHECK(first_token_without_bans(translator, "Ein Mann läuft.") == newline);  // what banning it prevents
  for (const models::Translation& t : short_translations(translator, "Ein Mann läuft.")) {
    CHECK(t.tokens() > 0);
    CHECK(std::none_of(t.text.begin(), t.text.end(),
                       [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; }));
  }
}
