// train_transformer: trains the encoder-decoder Transformer. Without arguments it learns a built-in
// toy corpus in seconds and checks its translations; with --train-src/--train-tgt it trains on a real
// parallel corpus (e.g. Multi30k de -> en) with checkpoints, resumption and BLEU.
#include "miniflow.h"
#include "tools/cli.h"
#include "tools/toy_corpus.h"
#include "tools/train_loop.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string_view>

namespace {

using mf::tools::UsageError;

struct Flags {
  std::string train_src, train_tgt, valid_src, valid_tgt;
  std::string checkpoint = "transformer.safetensors", plot;
  mf::Device device = mf::Device::cpu();
  int64_t epochs = 10, d_model = 256, heads = 8, layers = 3, encoder_layers = 0, decoder_layers = 0, d_ff = 512;
  int64_t max_len = 100, min_freq = 2, max_vocab = 0, log_every = 50, bleu_sentences = 0;
  int64_t max_steps = 0;
  double dropout = 0.1;
  bool no_lowercase = false, resume = false, detect_anomaly = false;
  int threads = mf::get_num_threads();
  mf::tools::OptimSettings optim{.seed = 1, .max_tokens = 1500, .warmup = 800, .lr_factor = 1.0,
                                 .label_smoothing = 0.1, .clip = 1.0};
};

/// True when `--name` appears on the command line (as `--name`, `--name VALUE` or `--name=VALUE`).
bool given(int argc, char** argv, std::string_view name) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.starts_with("--") && arg.substr(2, name.size()) == name &&
        (arg.size() == name.size() + 2 || arg[name.size() + 2] == '='))
      return true;
  }
  return false;
}

/// The toy corpus's settings, for every flag the user did not give.
void apply_toy_defaults(Flags& f, int argc, char** argv) {
  auto set = [&](const char* name, auto& field, auto value) {
    if (!given(argc, argv, name)) field = value;
  };
  const mf::tools::ToySetup toy;
  set("epochs", f.epochs, toy.epochs);
  set("d-model", f.d_model, toy.d_model);
  set("heads", f.heads, toy.heads);
  set("layers", f.layers, toy.layers);
  set("d-ff", f.d_ff, toy.d_ff);
  set("dropout", f.dropout, toy.dropout);
  set("max-len", f.max_len, toy.max_len);
  set("min-freq", f.min_freq, toy.min_freq);
  set("max-tokens", f.optim.max_tokens, toy.optim.max_tokens);
  set("warmup", f.optim.warmup, toy.optim.warmup);
  set("lr-factor", f.optim.lr_factor, toy.optim.lr_factor);
  set("log-every", f.log_every, toy.log_every);
  set("checkpoint", f.checkpoint, std::string());  // the toy run saves only when asked
}

void check_flags(const Flags& f) {
  if (f.train_src.empty() != f.train_tgt.empty()) throw UsageError("--train-src and --train-tgt go together");
  if (f.valid_src.empty() != f.valid_tgt.empty()) throw UsageError("--valid-src and --valid-tgt go together");
  if (f.train_src.empty() && !f.valid_src.empty()) throw UsageError("--valid-src needs --train-src/--train-tgt");
  if (f.epochs < 1 || f.d_model < 1 || f.heads < 1 || f.layers < 1 || f.d_ff < 1 || f.max_len < 2 ||
      f.min_freq < 1 || f.log_every < 1 || f.optim.max_tokens < 1 || f.optim.warmup < 1)
    throw UsageError("--epochs, --d-model, --heads, --layers, --d-ff, --min-freq, --log-every, --max-tokens and "
                     "--warmup must be positive, --max-len at least 2");
  if (f.encoder_layers < 0 || f.decoder_layers < 0 || f.max_vocab < 0 || f.bleu_sentences < 0 ||
      f.max_steps < 0)
    throw UsageError("--encoder-layers, --decoder-layers, --max-vocab, --bleu-sentences and --max-steps cannot be "
                     "negative");
  if (f.optim.max_tokens < f.max_len)
    throw UsageError(fmt::format("--max-tokens {} is below --max-len {}: the longest pair would not fit a batch",
                                 f.optim.max_tokens, f.max_len));
  if (f.d_model % f.heads != 0) throw UsageError(fmt::format("--d-model {} is not a multiple of --heads {}", f.d_model, f.heads));
  if (!(f.dropout >= 0 && f.dropout < 1)) throw UsageError("--dropout must be in [0, 1)");
  if (!(f.optim.label_smoothing >= 0 && f.optim.label_smoothing < 1)) throw UsageError("--label-smoothing must be in [0, 1)");
  if (!(f.optim.lr_factor > 0) || !(f.optim.clip >= 0)) throw UsageError("--lr-factor must be positive, --clip >= 0");
  if (f.threads < 1) throw UsageError("--threads must be positive");
  if (f.resume && f.checkpoint.empty()) throw UsageError("--resume needs --checkpoint");
}

/// Reads a corpus, logging what was skipped or truncated.
mf::text::Corpus read_corpus(const std::string& what, const std::string& src, const std::string& tgt,
                       const mf::text::CorpusOptions& options) {
  mf::text::Corpus corpus = mf::text::read_parallel_corpus(src, tgt, options);
  const mf::text::CorpusStats& s = corpus.stats;
  fmt::print("{}: {} pairs from '{}' / '{}'", what, s.pairs, src, tgt);
  if (s.skipped_empty > 0) fmt::print(", {} pairs skipped for an empty line", s.skipped_empty);
  if (s.truncated_sources + s.truncated_targets > 0)
    fmt::print(", {} sources and {} targets truncated to {} tokens", s.truncated_sources, s.truncated_targets,
               options.max_length);
  fmt::print("\n");
  MF_CHECK(s.pairs > 0, "{}: '{}' / '{}' hold no sentence pairs", what, src, tgt);
  return corpus;
}

/// Refuses a checkpoint whose model, vocabularies or tokenizer differ from what the flags and the
/// training data give, naming the first difference.
void check_checkpoint_fits(const mf::models::Translator& saved, const mf::models::Translator& wanted,
                           const std::string& path) {
  auto a = nlohmann::json::parse(saved.model_ptr()->config().to_json());
  auto b = nlohmann::json::parse(wanted.model_ptr()->config().to_json());
  for (auto& [key, value] : b.items())
    MF_CHECK(a.contains(key) && a[key] == value,
             "checkpoint '{}' has {} = {}, but the flags and data give {}; resume with the flags of the run that "
             "wrote it", path, key, a.contains(key) ? a[key].dump() : "nothing", value.dump());
  MF_CHECK(saved.src_vocab() == wanted.src_vocab() && saved.tgt_vocab() == wanted.tgt_vocab(),
           "checkpoint '{}' has other vocabularies (source {} / target {} tokens) than the training data gives with "
           "these flags ({} / {}); resume with the same data, --min-freq and --max-vocab",
           path, saved.src_vocab().size(), saved.tgt_vocab().size(), wanted.src_vocab().size(),
           wanted.tgt_vocab().size());
  MF_CHECK(saved.tokenizer().options().lowercase == wanted.tokenizer().options().lowercase,
           "checkpoint '{}' was trained {} lowercasing; --no-lowercase must match", path,
           saved.tokenizer().options().lowercase ? "with" : "without");
}

/// Translates the toy sources greedily and with beam 4, prints them, and counts the right ones.
int report_toy(mf::models::Translator& translator) {
  std::vector<mf::tools::ToyTranslation> results = mf::tools::translate_toy(translator);
  size_t correct = 0;
  for (const mf::tools::ToyTranslation& t : results) {
    correct += t.right() ? 1 : 0;
    fmt::print("{:<20} -> greedy: {:<18} beam: {:<18} {}\n", t.source, t.greedy, t.beam, t.right() ? "ok" : "WRONG");
  }
  fmt::print("{}/{} correct\n", correct, results.size());
  std::fflush(stdout);
  if (correct != results.size()) {
    fmt::print(stderr, "train_transformer: the toy corpus was not learned ({} of {} translations wrong)\n",
               results.size() - correct, results.size());
    return 1;
  }
  return 0;
}

int run(int argc, char** argv) {
  Flags f;
  mf::tools::ArgParser args(
      "train_transformer",
      "Trains an encoder-decoder Transformer. Without --train-src/--train-tgt it learns a built-in toy corpus\n"
      "(8 pairs, small model, a few seconds) and checks its greedy and beam translations; the toy run uses its own\n"
      "defaults for the model and schedule flags you do not give, and saves a checkpoint/plot only when asked.\n"
      "Empty lines are skipped (counted in the log); longer sentences are truncated to --max-len - 1 tokens.\n"
      "--resume continues exactly where --checkpoint stopped (same batches, same random stream): give the same\n"
      "data and flags as the run that wrote it (a different model, vocabulary or schedule is an error);\n"
      "only --epochs may grow.");
  args.add("train-src", &f.train_src, "training sources, one sentence per line");
  args.add("train-tgt", &f.train_tgt, "training targets, line-aligned with --train-src");
  args.add("valid-src", &f.valid_src, "validation sources (loss, perplexity and BLEU each epoch)");
  args.add("valid-tgt", &f.valid_tgt, "validation targets");
  args.add("epochs", &f.epochs, "epochs to train (in all, counting resumed ones)");
  args.add("max-tokens", &f.optim.max_tokens, "token budget of a batch, padding included");
  args.add("warmup", &f.optim.warmup, "Noam schedule warmup steps");
  args.add("lr-factor", &f.optim.lr_factor, "Noam schedule factor: lr = f * d_model^-0.5 * min(t^-0.5, t * warmup^-1.5)");
  args.add("label-smoothing", &f.optim.label_smoothing, "label smoothing of the training loss");
  args.add("clip", &f.optim.clip, "gradient norm clipping; 0: off");
  args.add("d-model", &f.d_model, "model width");
  args.add("heads", &f.heads, "attention heads");
  args.add("layers", &f.layers, "encoder and decoder layers");
  args.add("encoder-layers", &f.encoder_layers, "encoder layers; 0: --layers");
  args.add("decoder-layers", &f.decoder_layers, "decoder layers; 0: --layers");
  args.add("d-ff", &f.d_ff, "feed-forward width");
  args.add("dropout", &f.dropout, "dropout");
  args.add("max-len", &f.max_len, "longest sequence in tokens, <sos>/<eos> included");
  args.add("min-freq", &f.min_freq, "vocabulary: least count of a kept token");
  args.add("max-vocab", &f.max_vocab, "vocabulary: most tokens per side, specials included; 0: no limit");
  args.add_switch("no-lowercase", &f.no_lowercase, "keep the case of the text (lowercased by default)");
  args.add("seed", &f.optim.seed, "random seed (initialisation, dropout, batch order)");
  args.add("threads", &f.threads, "intra-op threads");
  args.add("device", &f.device, "where the model trains: cpu, cuda or cuda:N");
  args.add("log-every", &f.log_every, "steps between progress lines when stdout is not a terminal");
  args.add("bleu-sentences", &f.bleu_sentences, "validation sentences translated for BLEU; 0: all");
  args.add("max-steps", &f.max_steps, "stop after this many steps of this run, saving a checkpoint; 0: no limit");
  args.add("checkpoint", &f.checkpoint, "checkpoint written each epoch and on Ctrl-C");
  args.add("plot", &f.plot, "SVG chart of the loss and BLEU curves (default: the checkpoint's path with .svg)");
  args.add_switch("resume", &f.resume, "continue from --checkpoint");
  args.add_switch("detect-anomaly", &f.detect_anomaly,
                  "stop at the first op that makes a NaN or inf, naming it (slow: for debugging a diverging run)");
  if (!args.parse(argc, argv)) return 0;
  const bool toy = f.train_src.empty() && f.train_tgt.empty();
  if (toy) apply_toy_defaults(f, argc, argv);
  check_flags(f);
  mf::tools::check_device_available(f.device, "--device");
  if (f.plot.empty() && !f.checkpoint.empty())
    f.plot = std::filesystem::path(f.checkpoint).replace_extension(".svg").string();
  mf::set_num_threads(f.threads);
  mf::autograd::set_detect_anomaly(f.detect_anomaly);
  mf::manual_seed(static_cast<uint64_t>(f.optim.seed));

  mf::text::CorpusOptions corpus_options{.tokenizer = {.lowercase = !f.no_lowercase}, .max_length = f.max_len - 1,
                                   .skip_empty = true};
  mf::text::Corpus train_corpus, valid_corpus;
  if (toy) {
    const mf::tools::ToySetup setup;
    train_corpus = mf::tools::make_toy_corpus(setup.repeats, corpus_options);
    fmt::print("toy corpus: {} pairs, each repeated {} times\n", mf::tools::toy_pairs().size(), setup.repeats);
  } else {
    train_corpus = read_corpus("train", f.train_src, f.train_tgt, corpus_options);
    if (!f.valid_src.empty()) valid_corpus = read_corpus("valid", f.valid_src, f.valid_tgt, corpus_options);
  }

  mf::models::Translator translator = mf::tools::build_translator(
      train_corpus, {.d_model = f.d_model, .heads = f.heads,
                     .encoder_layers = f.encoder_layers > 0 ? f.encoder_layers : f.layers,
                     .decoder_layers = f.decoder_layers > 0 ? f.decoder_layers : f.layers, .d_ff = f.d_ff,
                     .max_len = f.max_len, .dropout = f.dropout, .min_freq = f.min_freq, .max_vocab = f.max_vocab,
                     .lowercase = !f.no_lowercase});
  const mf::models::TransformerConfig& config = translator.model().config();
  if (f.resume) check_checkpoint_fits(mf::models::Translator::load(f.checkpoint), translator, f.checkpoint);

  // Initialised on the CPU from --seed, then moved: the same starting weights on every device.
  translator.model().to(f.device);
  fmt::print("model: {}+{} layers, d_model {}, {} heads, d_ff {}, dropout {}, {} parameters; vocabularies {} / {}; "
             "on {}\n", config.encoder_layers, config.decoder_layers, f.d_model, f.heads, f.d_ff, f.dropout,
             translator.model().parameter_count(),
             translator.src_vocab().size(), translator.tgt_vocab().size(), f.device.str());

  mf::tools::ParallelData train = mf::tools::encode_corpus(translator, train_corpus.sources, train_corpus.targets);
  mf::tools::ParallelData valid = mf::tools::encode_corpus(translator, valid_corpus.sources, valid_corpus.targets);
  int status = mf::tools::train_translator(
      translator, train, valid,
      {.optim = f.optim, .epochs = f.epochs, .log_every = f.log_every, .bleu_sentences = f.bleu_sentences,
       .max_steps = f.max_steps,
       .checkpoint = f.checkpoint, .plot = f.plot, .resume = f.resume, .quiet_epochs = toy});
  if (status != 0) return status;
  if (!f.checkpoint.empty()) fmt::print("checkpoint: '{}'\n", f.checkpoint);
  return toy ? report_toy(translator) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mf::tools::run_tool("train_transformer", [&] { return run(argc, argv); });
}
