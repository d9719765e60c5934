#include "train/toy_corpus.h"

namespace mf::train {

const std::vector<std::pair<std::string, std::string>>& toy_pairs() {
  // The tutorials' pairs.
  static const std::vector<std::pair<std::string, std::string>> pairs = {
      {"ich mochte ein bier", "i want a beer"},    {"ich mochte ein cola", "i want a coke"},
      {"hello world", "hola mundo"},               {"i love you", "te amo"},
      {"the cat is black", "el gato es negro"},    {"good morning", "buenos dias"},
      {"this is a book", "este es un libro"},      {"what is your name", "como te llamas"}};
  return pairs;
}

TrainingOptions toy_options() {
  TrainingOptions options;
  options.model = {.d_model = 64, .heads = 4, .encoder_layers = 1, .decoder_layers = 1, .d_ff = 128, .dropout = 0.0,
                   .max_len = 16};
  options.units = TrainingOptions::Units::Words;  // 8 pairs of 26 words: too few to learn subwords from
  options.vocab.min_freq = 1;
  options.optim.max_tokens = 48;
  // Sorted by length over the whole epoch, the 8 pairs fall into batches of one or two pairs each, and
  // the last few batches could make the model forget a pair (1 seed in 40 did); pools of 64 mix them.
  options.optim.batch_pool = 64;
  options.optim.warmup = 100;
  options.optim.lr_factor = 0.5;
  options.epochs = 1;
  options.average_last = 0;  // one epoch, and no checkpoint unless asked
  options.log_every = 100;
  options.quiet_epochs = true;
  return options;
}

text::Corpus make_toy_corpus(int64_t repeats, const text::CorpusOptions& options) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (int64_t r = 0; r < repeats; ++r) pairs.insert(pairs.end(), toy_pairs().begin(), toy_pairs().end());
  return text::make_corpus(pairs, options);
}

std::vector<ToyTranslation> translate_toy(models::Translator& translator) {
  translator.model().eval();
  std::vector<std::string> sources;
  for (const auto& pair : toy_pairs()) sources.push_back(pair.first);
  std::vector<std::string> greedy = translator.translate_greedy(sources, 12);
  auto beams = translator.translate(sources, {.beam_size = 4, .max_new_tokens = 12});
  std::vector<ToyTranslation> out;
  for (size_t i = 0; i < sources.size(); ++i)
    out.push_back({sources[i], greedy[i], beams[i].front().text, toy_pairs()[i].second});
  return out;
}

}  // namespace mf::train
