// Test helper for tests/tools_translate.sh: writes checkpoints for the translate tool to read.
//
//   make_toy_checkpoint PATH          trains a tiny Translator on the toy pairs below until its greedy
//                                     translations of all of them are right, then saves it to PATH
//                                     (exit 1 if it does not get there)
//   make_toy_checkpoint --plain PATH  writes a valid safetensors file that is not a translation model
//   make_toy_checkpoint --other-config PATH
//   make_toy_checkpoint --other-vocab PATH
//                                     write a translation checkpoint whose config (d_ff doubled) or
//                                     source vocabulary (one token more) does not fit its tensors, as
//                                     when the files of two runs get mixed up
#include "miniflow.h"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

// The tutorials' toy pairs (de -> en and en -> es), the corpus the toy training uses.
const std::vector<std::pair<std::string, std::string>> kPairs = {
    {"ich mochte ein bier", "i want a beer"},     {"ich mochte ein cola", "i want a coke"},
    {"hello world", "hola mundo"},                {"i love you", "te amo"},
    {"the cat is black", "el gato es negro"},     {"good morning", "buenos dias"},
    {"this is a book", "este es un libro"},       {"what is your name", "como te llamas"},
};

mf::text::Vocab build_vocab(const std::vector<std::vector<std::string>>& sentences) {
  mf::text::TokenCounts counts;
  mf::text::count_tokens(sentences, counts);
  return mf::text::Vocab::build(counts);
}

/// An untrained translator for the toy pairs: 2 + 2 layers, d_model 32, max_len 16.
mf::models::Translator toy_translator(const mf::text::Corpus& corpus) {
  mf::text::Vocab src = build_vocab(corpus.sources), tgt = build_vocab(corpus.targets);
  mf::models::TransformerConfig config{.src_vocab = src.size(), .tgt_vocab = tgt.size(), .d_model = 32, .heads = 4,
                                       .encoder_layers = 2, .decoder_layers = 2, .d_ff = 64, .dropout = 0.0,
                                       .max_len = 16, .shared_embeddings = false};
  return mf::models::Translator(config, src, tgt, {});
}

/// Full-batch Adam until every greedy translation matches its target and the loss is below 0.02
/// (a margin, so beam search and batching cannot tip a near tie), checked every 25 steps.
int train(const std::string& path) {
  mf::manual_seed(7);
  mf::text::Corpus corpus = mf::text::make_corpus(kPairs);
  mf::models::Translator translator = toy_translator(corpus);
  const mf::text::Vocab& src = *translator.source().words();
  const mf::text::Vocab& tgt = *translator.target().words();
  std::vector<std::vector<int64_t>> src_ids, tgt_ids;
  std::vector<int64_t> all;
  std::vector<std::string> sources, targets;
  for (size_t i = 0; i < kPairs.size(); ++i) {
    src_ids.push_back(src.encode(corpus.sources[i]));
    tgt_ids.push_back(tgt.encode(corpus.targets[i]));
    all.push_back(static_cast<int64_t>(i));
    sources.push_back(kPairs[i].first);
    targets.push_back(kPairs[i].second);
  }
  mf::models::TranslationBatch batch = mf::models::make_translation_batch(src_ids, tgt_ids, all);
  mf::models::Transformer& model = translator.model();
  mf::optim::Adam adam(model.parameters(), {.lr = 3e-3});
  for (int step = 1; step <= 1000; ++step) {
    model.train();
    mf::Tensor loss = model.loss(model.forward(batch.src, batch.tgt_in), batch.tgt_out, 0.0);
    loss.backward();
    adam.step();
    adam.zero_grad();
    if (step % 25 != 0 || loss.item<double>() > 0.02) continue;
    model.eval();
    if (translator.translate_greedy(sources, 10) == targets) {
      translator.save(path);
      fmt::print("memorised {} pairs after {} steps (loss {:.4f}); saved {}\n", kPairs.size(), step,
                 loss.item<double>(), path);
      return 0;
    }
  }
  fmt::print(stderr, "make_toy_checkpoint: the toy model did not memorise its pairs in 1000 steps\n");
  return 1;
}

/// A toy checkpoint whose metadata no longer fits its tensors: d_ff doubled, or a source vocabulary
/// with one more token (and the config's src_vocab to match it).
void write_mismatched(const std::string& path, bool other_vocab) {
  mf::text::Corpus corpus = mf::text::make_corpus(kPairs);
  toy_translator(corpus).save(path);
  mf::nn::TensorFile file = mf::nn::load_tensors(path);
  auto config = mf::models::TransformerConfig::from_json(file.metadata.at("translation.config"));
  if (other_vocab) {
    corpus.sources.push_back({"zusätzlich"});
    mf::text::Vocab bigger = build_vocab(corpus.sources);
    config.src_vocab = bigger.size();
    file.metadata["translation.source"] = mf::text::TextCodec(bigger, {}).to_json();
  } else {
    config.d_ff *= 2;
  }
  file.metadata["translation.config"] = config.to_json();
  mf::nn::save_tensors(path, file.tensors, file.metadata);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::strcmp(argv[1], "--plain") == 0) {
      mf::nn::save_tensors(argv[2], {{"weight", mf::zeros({2, 2})}});
      return 0;
    }
    if (argc == 3 && (std::strcmp(argv[1], "--other-config") == 0 || std::strcmp(argv[1], "--other-vocab") == 0)) {
      write_mismatched(argv[2], std::strcmp(argv[1], "--other-vocab") == 0);
      return 0;
    }
    if (argc == 2) return train(argv[1]);
    fmt::print(stderr, "usage: make_toy_checkpoint [--plain | --other-config | --other-vocab] PATH\n");
    return 2;
  } catch (const std::exception& error) {
    fmt::print(stderr, "make_toy_checkpoint: {}\n", error.what());
    return 1;
  }
}
