// train_transformer: trains the encoder-decoder Transformer. Without arguments it learns a built-in
// toy corpus in seconds and checks its translations; with --train-src/--train-tgt it trains on a real
// parallel corpus (e.g. Multi30k de -> en) with checkpoints, resumption and BLEU.
#include "miniflow.h"
#include "tools/cli.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string_view>

namespace {

using mf::tools::UsageError;

/// The command line: the training options (whose defaults are the flags' defaults), and what only the
/// tool has: the data files, the device, threads, and flags that stand for several options.
struct Flags {
  mf::train::TrainingOptions options;
  std::string train_src, train_tgt, valid_src, valid_tgt;
  mf::Device device = mf::Device::cpu();
  /// Both stacks' depth, unless --encoder-layers / --decoder-layers (0: this) say otherwise.
  int64_t layers = options.model.encoder_layers, encoder_layers = 0, decoder_layers = 0;
  bool no_lowercase = false, detect_anomaly = false, distributed = false, dist_deterministic = false;
  bool no_overlap = false;
  bool separate_subwords = false, no_byte_fallback = false;
  std::string subword;  // --subword: unigram, bpe or none (words)
  std::string precision = "fp32";
  std::string grad_compression = "none";
  int threads = mf::get_num_threads();
  double dist_timeout = 600;  // seconds
  double bucket_mb = static_cast<double>(options.data_parallel.bucket_bytes) / (1 << 20);

  /// The defaults of a run on a real corpus (a checkpoint each epoch), or of the toy run
  /// (train::toy_options(): no checkpoint unless asked).
  static Flags defaults(bool toy) {
    Flags f;
    f.options = toy ? mf::train::toy_options() : mf::train::TrainingOptions{};
    f.subword = f.options.units == mf::train::TrainingOptions::Units::Words ? "none" : "unigram";
    if (!toy) f.options.checkpoint = "transformer.safetensors";
    f.layers = f.options.model.encoder_layers;  // both stacks are equally deep in either default
    return f;
  }
};

/// A TrainingOptions field as this tool's flag names it: "optim.lr_factor" -> "--lr-factor".
std::string flag_of(std::string_view field) {
  std::string name(field.substr(field.rfind('.') + 1));  // npos + 1 == 0: a path without a dot
  std::replace(name.begin(), name.end(), '_', '-');
  return "--" + name;
}

void check_flags(const Flags& f) {
  const mf::train::TrainingOptions& o = f.options;
  if (f.train_src.empty() != f.train_tgt.empty()) throw UsageError("--train-src and --train-tgt go together");
  if (f.valid_src.empty() != f.valid_tgt.empty()) throw UsageError("--valid-src and --valid-tgt go together");
  if (f.train_src.empty() && !f.valid_src.empty()) throw UsageError("--valid-src needs --train-src/--train-tgt");
  if (o.epochs < 1 || o.model.d_model < 1 || o.model.heads < 1 || f.layers < 1 || o.model.d_ff < 1 ||
      o.model.max_len < 2 || o.vocab.min_freq < 1 || o.log_every < 1 || o.optim.max_tokens < 1 || o.optim.warmup < 1)
    throw UsageError("--epochs, --d-model, --heads, --layers, --d-ff, --min-freq, --log-every, --max-tokens and "
                     "--warmup must be positive, --max-len at least 2");
  if (f.encoder_layers < 0 || f.decoder_layers < 0 || o.vocab.max_size < 0 || o.bleu_sentences < 0 ||
      o.max_steps < 0 || o.optim.batch_pool < 0 || o.patience < 0 || o.average_last < 0)
    throw UsageError("--encoder-layers, --decoder-layers, --max-vocab, --bleu-sentences, --max-steps, --batch-pool, "
                     "--patience and --average-last cannot be negative");
  if (o.valid_beam < 1) throw UsageError("--valid-beam must be at least 1");
  if (o.average_last > 0 && o.checkpoint.empty())
    throw UsageError("--average-last keeps models beside --checkpoint: give one");
  if (o.optim.max_tokens < o.model.max_len)
    throw UsageError(fmt::format("--max-tokens {} is below --max-len {}: the longest pair would not fit a batch",
                                 o.optim.max_tokens, o.model.max_len));
  if (o.model.d_model % o.model.heads != 0)
    throw UsageError(fmt::format("--d-model {} is not a multiple of --heads {}", o.model.d_model, o.model.heads));
  if (!(o.model.dropout >= 0 && o.model.dropout < 1)) throw UsageError("--dropout must be in [0, 1)");
  if (!(o.optim.label_smoothing >= 0 && o.optim.label_smoothing < 1))
    throw UsageError("--label-smoothing must be in [0, 1)");
  if (!(o.optim.lr_factor > 0) || !(o.optim.clip >= 0)) throw UsageError("--lr-factor must be positive, --clip >= 0");
  if (f.threads < 1) throw UsageError("--threads must be positive");
  if (f.subword != "none" && f.subword != "unigram" && f.subword != "bpe")
    throw UsageError(fmt::format("--subword must be unigram, bpe or none, not '{}'", f.subword));
  if (o.subword.vocab_size <= mf::text::kSpecialTokenCount)
    throw UsageError(fmt::format("--subword-size must exceed the {} specials", mf::text::kSpecialTokenCount));
  if (!(o.optim.subword_alpha >= 0) || (f.subword == "bpe" && !(o.optim.subword_alpha < 1)))
    throw UsageError(fmt::format("--subword-alpha must be 0 (off) or positive, below 1 for bpe (a merge's dropout "
                                 "probability), not {}", o.optim.subword_alpha));
  if (o.optim.subword_nbest != -1 && o.optim.subword_nbest < 2)
    throw UsageError(fmt::format("--subword-nbest must be -1 (every segmentation) or at least 2, not {}",
                                 o.optim.subword_nbest));
  if (o.optim.subword_alpha > 0 && f.subword == "none" && o.subword_model.empty())
    throw UsageError("--subword-alpha samples subword segmentations: it needs --subword unigram or bpe");
  if (o.resume && o.checkpoint.empty()) throw UsageError("--resume needs --checkpoint");
  if (o.accumulate < 1) throw UsageError("--accumulate must be positive");
  if (!(f.dist_timeout > 0) || !(f.bucket_mb > 0)) throw UsageError("--dist-timeout and --bucket-mb must be positive");
  if (f.grad_compression != "none" && f.grad_compression != "bf16")
    throw UsageError(fmt::format("--grad-compression must be none or bf16, not '{}'", f.grad_compression));
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
  const mf::text::TokenizerOptions *saved_words = saved.source().tokenizer(),
                                    *wanted_words = wanted.source().tokenizer();
  if (saved_words != nullptr && wanted_words != nullptr)
    MF_CHECK(saved_words->lowercase == wanted_words->lowercase,
             "checkpoint '{}' was trained {} lowercasing; --no-lowercase must match", path,
             saved_words->lowercase ? "with" : "without");
  MF_CHECK(saved.source() == wanted.source() && saved.target() == wanted.target(),
           "checkpoint '{}' has other vocabularies (source {} / target {}) than the training data gives with these "
           "flags ({} / {}); resume with the same data and vocabulary flags (--subword..., --min-freq, --max-vocab)",
           path, saved.source().describe(), saved.target().describe(), wanted.source().describe(),
           wanted.target().describe());
}

/// Translates the toy sources greedily and with beam 4, prints them, and counts the right ones.
int report_toy(mf::models::Translator& translator) {
  std::vector<mf::train::ToyTranslation> results = mf::train::translate_toy(translator);
  size_t correct = 0;
  for (const mf::train::ToyTranslation& t : results) {
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

/// Parses argv into `f`, whose values are the defaults of the flags not given. Returns false when
/// --help or --version was printed.
bool parse_flags(int argc, char** argv, Flags& f) {
  mf::train::TrainingOptions& o = f.options;
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
  args.add("epochs", &o.epochs, "epochs to train (in all, counting resumed ones)");
  args.add("max-tokens", &o.optim.max_tokens, "token budget of a batch, padding included");
  args.add("batch-pool", &o.optim.batch_pool,
           "sentences shuffled, then sorted by length in pools of this many before batching (less padding, "
           "fewer mixed lengths); 0: the whole epoch is one pool");
  args.add("warmup", &o.optim.warmup, "Noam schedule warmup steps");
  args.add("lr-factor", &o.optim.lr_factor,
           "Noam schedule factor: lr = f * d_model^-0.5 * min(t^-0.5, t * warmup^-1.5)");
  args.add("label-smoothing", &o.optim.label_smoothing, "label smoothing of the training loss");
  args.add("clip", &o.optim.clip, "gradient norm clipping; 0: off");
  args.add("d-model", &o.model.d_model, "model width");
  args.add("heads", &o.model.heads, "attention heads");
  args.add("layers", &f.layers, "encoder and decoder layers");
  args.add("encoder-layers", &f.encoder_layers, "encoder layers; 0: --layers");
  args.add("decoder-layers", &f.decoder_layers, "decoder layers; 0: --layers");
  args.add("d-ff", &o.model.d_ff, "feed-forward width");
  args.add("dropout", &o.model.dropout, "dropout");
  args.add("max-len", &o.model.max_len, "longest sequence in tokens, <sos>/<eos> included");
  args.add("min-freq", &o.vocab.min_freq, "vocabulary: least count of a kept token");
  args.add("max-vocab", &o.vocab.max_size, "vocabulary: most tokens per side, specials included; 0: no limit");
  args.add_switch("no-lowercase", &f.no_lowercase, "keep the case of the text (lowercased by default)");
  args.add("subword", &f.subword,
           "vocabulary units: unigram or bpe (a SentencePiece model learned from the training text and stored in "
           "the checkpoint: cased, untokenized output), or none (words)");
  args.add("subword-size", &o.subword.vocab_size, "subword vocabulary size, the 4 specials included");
  args.add("subword-model", &o.subword_model,
           "an existing SentencePiece .model for both sides instead of learning one (implies --subword)");
  args.add_switch("separate-subwords", &f.separate_subwords,
                  "one subword model per language instead of one shared model (and shared embeddings)");
  args.add_switch("no-byte-fallback", &f.no_byte_fallback,
                  "unseen characters become <unk> instead of UTF-8 byte pieces");
  args.add("subword-alpha", &o.optim.subword_alpha,
           "subword regularization: each epoch trains on newly sampled segmentations of the pairs, drawn with "
           "probability P^A for unigram (smaller A: more varied; 0.5 gives Multi30k 3% more pieces) or skipping "
           "each merge with probability A for bpe (BPE-dropout); 0: off, the best segmentation");
  args.add("subword-nbest", &o.optim.subword_nbest,
           "unigram subword sampling draws among the N best segmentations; -1: among all");
  args.add("seed", &o.optim.seed, "random seed (initialisation, dropout, batch order)");
  args.add("threads", &f.threads, "intra-op threads");
  args.add("device", &f.device, "where the model trains: cpu, cuda or cuda:N");
  args.add("precision", &f.precision,
           "fp32, or bf16: mixed precision (autocast: GEMMs on bfloat16 operands summed in float32; "
           "float32 weights, checkpoints and everything else)");
  args.add("log-every", &o.log_every, "steps between progress lines when stdout is not a terminal");
  args.add("bleu-sentences", &o.bleu_sentences, "validation sentences translated for BLEU; 0: all");
  args.add("valid-beam", &o.valid_beam, "beam size of the validation translations (BLEU, chrF); 1: greedy");
  args.add("patience", &o.patience,
           "stop when validation BLEU has not improved for this many epochs, keeping the best model beside the "
           "checkpoint (NAME.best.safetensors); 0: never");
  args.add("average-last", &o.average_last,
           "keep the last N epochs' models (NAME.epochK.safetensors) and write their mean at the end "
           "(NAME.averaged.safetensors); 0: off");
  args.add("max-steps", &o.max_steps, "stop after this many steps of this run, saving a checkpoint; 0: no limit");
  args.add("checkpoint", &o.checkpoint, "checkpoint written each epoch and on Ctrl-C");
  args.add("plot", &o.plot, "SVG chart of the loss and BLEU curves (default: the checkpoint's path with .svg)");
  args.add_switch("resume", &o.resume, "continue from --checkpoint");
  args.add("accumulate", &o.accumulate,
           "split each batch into this many shares per process, accumulating their gradients (less memory)");
  args.add_switch("distributed", &f.distributed,
                  "data-parallel training: join the job mpirun started (each rank trains on its share of every "
                  "batch; rank 0 prints and saves)");
  args.add("dist-timeout", &f.dist_timeout,
           "seconds a collective may take before the job is ended with an error naming it and the missing ranks");
  args.add("bucket-mb", &f.bucket_mb, "megabytes of gradients reduced together while backward runs");
  args.add_switch("no-overlap", &f.no_overlap,
                  "reduce the gradients after backward, not while it runs (faster where every core runs a rank's "
                  "backward: the ranks of one machine)");
  args.add("grad-compression", &f.grad_compression,
           "what gradients travel as between ranks: none (float32) or bf16 (half the bytes, rounded to "
           "bfloat16 as PyTorch's bf16_compress_hook)");
  args.add_switch("shard-optimizer", &o.shard_optimizer,
                  "with --distributed: each rank keeps 1/W of Adam's state (ZeRO stage 1); same steps and checkpoints");
  args.add_switch("dist-deterministic", &f.dist_deterministic,
                  "sum the ranks' gradients in rank order: the same bits whatever the world size and backend");
  args.add_switch("detect-anomaly", &f.detect_anomaly,
                  "stop at the first op that makes a NaN or inf, naming it (slow: for debugging a diverging run)");
  return args.parse(argc, argv);
}

/// Trains as the flags say (on this rank's share, in a distributed job).
int train_with_flags(Flags& f, bool toy) {
  mf::train::TrainingOptions& o = f.options;
  mf::tools::check_device_available(f.device, "--device");
  o.autocast = mf::tools::autocast_from_precision_flag(f.precision, f.device);
  if (o.plot.empty() && !o.checkpoint.empty()) o.plot = std::filesystem::path(o.checkpoint).replace_extension(".svg");
  mf::set_num_threads(f.threads);
  mf::autograd::set_detect_anomaly(f.detect_anomaly);
  mf::manual_seed(static_cast<uint64_t>(o.optim.seed));
  // The flags that are not one option each, and the words the loop's messages use for its options.
  o.model.encoder_layers = f.encoder_layers > 0 ? f.encoder_layers : f.layers;
  o.model.decoder_layers = f.decoder_layers > 0 ? f.decoder_layers : f.layers;
  o.tokenizer.lowercase = !f.no_lowercase;
  o.units = f.subword == "none" && o.subword_model.empty() ? mf::train::TrainingOptions::Units::Words
                                                           : mf::train::TrainingOptions::Units::Subwords;
  o.subword.algorithm = f.subword == "bpe" ? mf::text::SubwordAlgorithm::Bpe : mf::text::SubwordAlgorithm::Unigram;
  o.joint_subwords = !f.separate_subwords;
  o.subword.byte_fallback = !f.no_byte_fallback;
  o.names = {.field = flag_of, .detect_anomaly = "rerun with --detect-anomaly"};

  mf::text::CorpusOptions corpus_options{.tokenizer = o.tokenizer, .max_length = o.model.max_len - 1,
                                         .skip_empty = true};
  mf::text::Corpus train_corpus, valid_corpus;
  if (toy) {
    train_corpus = mf::train::make_toy_corpus(mf::train::kToyRepeats, corpus_options);
    fmt::print("toy corpus: {} pairs, each repeated {} times\n", mf::train::toy_pairs().size(), mf::train::kToyRepeats);
  } else {
    train_corpus = read_corpus("train", f.train_src, f.train_tgt, corpus_options);
    if (!f.valid_src.empty()) valid_corpus = read_corpus("valid", f.valid_src, f.valid_tgt, corpus_options);
  }

  mf::models::Translator translator = mf::train::build_translator(train_corpus, o);
  const mf::models::TransformerConfig& config = translator.model().config();
  if (o.resume) check_checkpoint_fits(mf::models::Translator::load(o.checkpoint), translator, o.checkpoint.string());

  // Initialised on the CPU from --seed, then moved: the same starting weights on every device.
  translator.model().to(f.device);
  const std::string vocabularies =
      config.shared_embeddings ? fmt::format("vocabulary {} shared by both sides", translator.source().describe())
                               : fmt::format("vocabularies {} / {}", translator.source().describe(),
                                             translator.target().describe());
  fmt::print("model: {}+{} layers, d_model {}, {} heads, d_ff {}, dropout {}, {} parameters; {}; on {}\n",
             config.encoder_layers, config.decoder_layers, config.d_model, config.heads, config.d_ff, config.dropout,
             translator.model().parameter_count(), vocabularies, f.device.str());

  int64_t truncated = 0;
  mf::train::ParallelData train = mf::train::encode_corpus(translator, train_corpus, config.max_len - 1, &truncated);
  mf::train::ParallelData valid = mf::train::encode_corpus(translator, valid_corpus, config.max_len - 1, &truncated);
  if (truncated > 0) fmt::print("{} sentences truncated to {} subwords\n", truncated, config.max_len - 1);
  if (o.optim.subword_alpha > 0)
    fmt::print("subword sampling: alpha {}, nbest {}; each epoch trains on new segmentations of the pairs\n",
               o.optim.subword_alpha, o.optim.subword_nbest);
  int status = mf::train::train_translator(translator, train, valid, o);
  if (status != 0) return status;
  if (!o.checkpoint.empty()) fmt::print("checkpoint: '{}'\n", o.checkpoint.string());
  return toy ? report_toy(translator) : 0;
}

int run(int argc, char** argv) {
  Flags f = Flags::defaults(/*toy=*/false);
  if (!parse_flags(argc, argv, f)) return 0;
  const bool toy = f.train_src.empty() && f.train_tgt.empty();
  if (toy) {  // the toy run's defaults under the flags the user gave
    f = Flags::defaults(/*toy=*/true);
    parse_flags(argc, argv, f);
  }
  mf::train::TrainingOptions& o = f.options;
  check_flags(f);
  std::shared_ptr<mf::distributed::ProcessGroup> group;
  if (f.distributed) {
    // CUDA tensors go GPU to GPU over NCCL where the build has it, else through host memory over MPI.
    const bool nccl = f.device.is_cuda() && mf::distributed::backend_available(mf::distributed::Backend::Nccl);
    group = mf::distributed::init_process_group(
        nccl ? mf::distributed::Backend::Nccl : mf::distributed::Backend::Mpi,
        {.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.dist_timeout * 1000))});
    if (group->rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)  // rank 0 speaks for the job
      throw mf::Error(fmt::format("[rank {}] cannot silence stdout", group->rank()));
    if (f.device.is_cuda()) f.device = mf::Device::cuda(group->rank() % std::max(1, mf::cuda::device_count()));
    o.group = group;
    o.data_parallel.bucket_bytes = static_cast<int64_t>(f.bucket_mb * (1 << 20));
    o.data_parallel.deterministic = f.dist_deterministic;
    o.data_parallel.overlap = !f.no_overlap;
    o.data_parallel.compression = f.grad_compression == "bf16" ? mf::distributed::GradientCompression::BFloat16
                                                               : mf::distributed::GradientCompression::None;
  }
  try {
    return train_with_flags(f, toy);
  } catch (const std::exception& error) {
    if (!group || group->world_size() == 1) throw;
    // The other ranks cannot know: end the whole job, or they would wait in their next collective.
    fmt::print(stderr, "[rank {}] train_transformer: error: {}\n", group->rank(), error.what());
    std::fflush(stderr);
    group->abort_job(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return mf::tools::run_tool("train_transformer", [&] { return run(argc, argv); });
}
