// tools/translate: translates text line by line with a checkpoint written by train_transformer (or by
// models::Translator::save).
//
//   translate --checkpoint model.safetensors < input.de > output.en
//   translate --checkpoint model.safetensors --input test.de --reference test.en --beam 4
//
// Input: UTF-8 text, one sentence per line (a trailing '\r' is dropped), from stdin or --input, read
// --buffer-lines lines at a time (10,000; one from a terminal, so that each line typed is translated at
// once); each group is sorted by length and translated in batches of at most --batch-tokens source
// tokens and --batch-sentences sentences (models::decode_sources), on the CPU --threads batches side by
// side, each on one thread (--batch-workers), and its output written (stdout is flushed) before the next
// group is read. --timing prints the speed and the CPU allocator's memory to stderr.
// Output, one line per input line, in input order:
//   --nbest 1 (default)  the best translation, as the target side's codec writes it (detokenized text
//                        for subwords; "i want a beer ." for a word vocabulary);
//   --nbest K > 1        K lines per input line, best first: "score<TAB>translation", score being the
//                        hypothesis's length-penalized log-probability with 4 decimals (higher is better);
//                        fewer than K only if the search found fewer (a target vocabulary smaller than K).
// A line without tokens (empty or only whitespace) gives an empty output line (with --nbest K, K
// lines "0.0000<TAB>"), so output and input stay line-aligned. Sentences longer than the model's
// max_len - 1 tokens are truncated, and their count is reported on stderr.
//
// --reference FILE prints two corpus scores of the best translations, as printed, against FILE's lines to
// stderr, computed and formatted as sacrebleu 2.4.3 does (text/sacrebleu.h): BLEU with its 13a tokenization,
// cased (lowercased with --lowercase-bleu, sacrebleu's --lowercase), and chrF, each with its signature:
//   "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3-miniflow = 34.56 67.1/42.0/28.3/19.5
//    (BP = 0.987 ratio = 0.987 hyp_len = 9876 ref_len = 10003)" (one line)
//   "chrF2|nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.4.3-miniflow = 58.42"
// --attention-svg PATH draws a decoder layer's cross-attention (mean over heads; --attention-layer, the
// last by default) for one input line (--attention-sentence, 1-based), translated again on its own with
// the same search: rows are the output tokens and <eos>, columns the source tokens (as tokenized, "(unk)"
// marking words outside the vocabulary) and <eos>.
//
// --alignment hard|soft|P adds each translation's word alignment after " ||| " (Marian's --alignment,
// fairseq's --print-alignment), read from that layer's cross-attention over the words as spaces separate
// them in the input line and in the printed translation (subwords gathered into their words; for a word
// vocabulary, its tokens), counted from 0: "hard" links each target word to the source word it attends
// to most, "S-T" pairs ("0-0 1-2 2-1"); P (0 < P < 1) links every pair weighing more than P; "soft"
// prints each target word's weights over the source words, comma-separated, one group per target word.
// An empty line gets " ||| " alone. With --score, the given translations are aligned.
//
// --score FILE scores instead of translating (forced decoding, as Marian's scorer and fairseq's
// --score-reference do): FILE's line i is taken as the translation of input line i, and the output's
// line i is "LOGPROB<TAB>TOKENS": the natural log of the probability the model gives that target
// after that source (its pieces or words and then <eos>, each given the ones before it; 4 decimals,
// 0 the most likely), and the tokens that sum covers, <eos> included. Empty lines are scored too (an
// empty target is <eos> alone). --batch-tokens counts source and target tokens together there.
//
// --target-prefix FILE gives each translation its beginning (CTranslate2's target_prefix: interactive
// translation, completing a given start): FILE's line i, encoded as the target side encodes text, is
// forced as the first tokens of line i's translation, which the search (any of them) continues; the
// output holds it, and --nbest's scores count its tokens. An empty line of FILE leaves its translation
// free; FILE is read in step with the input and must have as many lines.
//
// --shortlist LEXICON (Marian's lexical shortlist) scores only each batch's likely target units: the
// target vocabulary's --shortlist-first (100) most frequent ids (specials, then pieces; SentencePiece's
// byte pieces come last in that order, not first as in its ids), each source unit's --shortlist-best (100)
// most probable translations in LEXICON (written by build_lexicon for this model), the source units
// themselves where both sides share one vocabulary, and <eos>; the other units cannot be produced.
// Faster (the output projection shrinks to those rows), and approximate: docs/translating.md says by
// how much on Multi30k.
//
// --ensemble A,B,... decodes with the models of those checkpoints beside --checkpoint's, as one model
// whose next-token probability is the mean of theirs (fairseq's ensembles; Marian's with equal
// weights over probabilities): independently trained runs usually translate better together than any
// one of them. They must share --checkpoint's vocabularies; --score scores under the ensemble too, and
// --attention-svg draws --checkpoint's model's attention over the ensemble's translation.
//
// --sampling draws each translation from the model's distribution instead of searching for the most
// probable one (fairseq's --sampling, used to back-translate), token by token, shaped by --temperature,
// --sampling-topk and --sampling-topp; --seed fixes the draws (the same seed and batching options give
// the same translations).
//
// --device cuda (or cuda:N) loads the checkpoint onto that GPU and decodes there; only the chosen
// tokens come back to the host each step.
//
// --precision int8 quantizes the model's Linear and Embedding weights to int8 per output channel as it
// loads (nn::quantize_int8) and decodes with the int8 GEMM on the CPU; a checkpoint written by
// quantize_checkpoint is int8 already, and decodes so whatever --precision says.
//
// Exit status: 0 on success, 2 on bad usage (unknown or malformed flags, --nbest > --beam, an unknown
// device, ...), 1 on any other error (missing or corrupt checkpoint, missing input, mismatched
// reference, --device cuda without CUDA or without a GPU).
#include "miniflow.h"
#include "tools/cli.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace models = mf::models;
using mf::tools::UsageError;

/// Input lines translated together unless --buffer-lines says otherwise: enough for length-sorted batches
/// to fill (groups of 1,000 already ran as fast as the whole input: BENCHMARKS.md), few enough that a
/// corpus of millions of lines neither sits in memory nor waits to be read whole before its first
/// translation comes out.
constexpr size_t kBufferLines = 10000;

struct Options {
  std::string checkpoint, input, output, reference, score, target_prefix, attention_svg, beam_stop = "exact",
      precision = "fp32", alignment;
  mf::Device device = mf::Device::cpu();
  int64_t beam = 1, nbest = 1, max_len = 100, min_len = 0, no_repeat_ngram_size = 0, attention_sentence = 1;
  int64_t attention_layer = 0;  // 0: the last
  double alignment_threshold = 0;  // --alignment P
  int64_t batch_tokens = mf::models::DecodingOptions{}.batch_tokens;
  int64_t batch_sentences = mf::models::DecodingOptions{}.batch_sentences;
  int64_t batch_workers = 0;
  int64_t buffer_lines = -1;
  std::vector<std::string> ensemble;  // --ensemble's checkpoints
  double length_penalty = 0.6;
  bool sampling = false;
  double temperature = 1.0, sampling_topp = 1.0;
  int64_t sampling_topk = 0, seed = 1;
  int threads = mf::get_num_threads();
  bool lowercase_bleu = false, timing = false;
  std::string shortlist;  // --shortlist's lexicon file
  int64_t shortlist_first = mf::models::DecodingOptions{}.shortlist_first;
  int64_t shortlist_best = mf::models::DecodingOptions{}.shortlist_best;
  std::optional<mf::text::Lexicon> lexicon;  // read from --shortlist once the checkpoint is loaded
};

/// The translations of a sentence, best first.
using Hypotheses = std::vector<models::Translation>;

/// Parses the command line; returns false after --help. Throws UsageError for bad usage.
bool parse_options(int argc, char** argv, Options& o) {
  std::string ensemble_paths;
  mf::tools::ArgParser args(
      "translate",
      "Translates UTF-8 text line by line (stdin or --input) with a translation checkpoint, writing one\n"
      "translation per input line (stdout or --output), as text (subwords) or tokens (words). Empty lines\n"
      "give empty lines. With --nbest K > 1 each input line gives K lines \"score<TAB>translation\", best\n"
      "first (score: length-penalized log-probability). --reference prints sacreBLEU's corpus BLEU (13a\n"
      "tokenization, cased unless --lowercase-bleu) and chrF, with their signatures, to stderr.\n"
      "Exit status: 0 ok, 2 bad usage, 1 any other error.");
  args.add("checkpoint", &o.checkpoint, "translation checkpoint (.safetensors), required");
  args.add("ensemble", &ensemble_paths,
           "more checkpoints, comma-separated, decoding with --checkpoint's as one model (the mean of their "
           "probabilities); each must have its vocabularies");
  args.add("input", &o.input, "file to translate, one sentence per line (default: stdin)");
  args.add("output", &o.output, "file to write, atomically (default: stdout)");
  args.add("beam", &o.beam, "beam width; 1 = greedy decoding");
  args.add("nbest", &o.nbest, "translations K per sentence (needs --beam >= K); K > 1 prints \"score<TAB>text\" lines");
  args.add("length-penalty", &o.length_penalty, "beam search's length penalty alpha (GNMT)");
  args.add("beam-stop", &o.beam_stop,
           "when beam search ends a sentence: exact (once no live hypothesis could still enter the best) or "
           "finished (once --beam hypotheses have ended, as fairseq: faster)");
  args.add("max-len", &o.max_len,
           "most tokens generated per sentence (each is further held to 1.5 times its source's tokens plus 10, and "
           "to the model's max length)");
  args.add("min-len", &o.min_len,
           "fewest tokens (subword pieces, <eos> not counted) a translation holds before it may end (fairseq's "
           "--min-len); 0: none");
  args.add("no-repeat-ngram-size", &o.no_repeat_ngram_size,
           "N > 0: no N tokens in a row twice in a translation (fairseq's and CTranslate2's no_repeat_ngram_size); "
           "0: off");
  args.add("batch-tokens", &o.batch_tokens,
           fmt::format("source tokens decoded together times --beam, padding included (sentences are sorted by "
                       "length first); 0: {} for beam search with float32 weights, else {}",
                       mf::models::kBatchTokens, mf::models::kSmallBatchTokens));
  args.add("batch-sentences", &o.batch_sentences, "most sentences decoded together; 0: no cap");
  args.add("batch-workers", &o.batch_workers,
           "batches decoded side by side on the CPU, each on one of the --threads threads (0: one per thread); "
           "1: one batch at a time, its ops split over the threads");
  args.add("shortlist", &o.shortlist,
           "score only the likely target units of each batch (Marian's --shortlist): a lexicon written by "
           "build_lexicon for this model; faster, approximate");
  args.add("shortlist-first", &o.shortlist_first,
           "--shortlist: the target vocabulary's most frequent units (byte pieces aside) always scored");
  args.add("shortlist-best", &o.shortlist_best, "--shortlist: the most probable translations of each source unit");
  args.add("buffer-lines", &o.buffer_lines,
           fmt::format("input lines read and translated together, their output written before more is read "
                       "(0: the whole input, sorted by length as one; -1: one at a time from a terminal, else {})",
                       kBufferLines));
  args.add("target-prefix", &o.target_prefix,
           "line i of this file begins the translation of input line i, which goes on from there (empty: no prefix)");
  args.add("reference", &o.reference,
           "reference translations, one per input line: print corpus BLEU and chrF to stderr");
  args.add_switch("sampling", &o.sampling,
                  "draw each translation from the model's distribution instead of searching (back-translation)");
  args.add("temperature", &o.temperature, "--sampling: logits divided by it (below 1 sharper, above 1 flatter)");
  args.add("sampling-topk", &o.sampling_topk, "--sampling: draw from the k most probable tokens only; 0: all");
  args.add("sampling-topp", &o.sampling_topp,
           "--sampling: draw from the most probable tokens whose probabilities first reach p (nucleus); 1: all");
  args.add("seed", &o.seed, "--sampling: random seed");
  args.add("score", &o.score,
           "score instead of translating: line i of this file as the translation of input line i, printing "
           "\"LOGPROB<TAB>TOKENS\" per line (its log-probability, <eos> included, and the tokens summed)");
  // Not sacrebleu's bare --lowercase: here that would read as lowercasing the translations.
  args.add_switch("lowercase-bleu", &o.lowercase_bleu,
                  "lowercase before BLEU (sacrebleu's --lowercase); chrF stays cased");
  args.add("attention-svg", &o.attention_svg, "write the cross-attention heatmap of one sentence to this SVG file");
  args.add("attention-sentence", &o.attention_sentence, "the input line (1-based) --attention-svg draws");
  args.add("alignment", &o.alignment,
           "append each translation's word alignment after \" ||| \": hard (\"S-T\" pairs, each target word to the "
           "source word it attends to most), P in (0, 1) (every pair weighing more), or soft (the weights)");
  args.add("attention-layer", &o.attention_layer,
           "the decoder layer (1-based) whose cross-attention --alignment and --attention-svg read; 0: the last");
  args.add("threads", &o.threads, "intra-op threads");
  args.add_switch("timing", &o.timing,
                  "print the sentences and tokens translated per second to stderr (model loading excluded), and the "
                  "CPU memory decoding's tensors took");
  args.add("device", &o.device, "where the model runs: cpu, cuda or cuda:N");
  args.add("precision", &o.precision,
           "fp32; bf16: the GEMMs on bfloat16 operands summed in float32 (autocast); int8: int8 weights and "
           "inputs, int32 sums (CPU)");
  if (!args.parse(argc, argv)) return false;
  if (o.checkpoint.empty()) throw UsageError("--checkpoint is required");
  if (!ensemble_paths.empty()) {
    for (size_t start = 0;;) {
      const size_t comma = ensemble_paths.find(',', start);
      o.ensemble.push_back(ensemble_paths.substr(start, comma == std::string::npos ? comma : comma - start));
      if (o.ensemble.back().empty())
        throw UsageError(fmt::format("--ensemble: an empty path in '{}'", ensemble_paths));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (o.beam < 1) throw UsageError(fmt::format("--beam must be at least 1, not {}", o.beam));
  if (o.nbest < 1) throw UsageError(fmt::format("--nbest must be at least 1, not {}", o.nbest));
  if (o.nbest > o.beam)
    throw UsageError(fmt::format("--nbest {} needs a beam at least as wide, but --beam is {}", o.nbest, o.beam));
  if (!std::isfinite(o.length_penalty)) throw UsageError("--length-penalty must be a finite number");
  if (o.beam_stop != "finished" && o.beam_stop != "exact")
    throw UsageError(fmt::format("--beam-stop must be finished or exact, not '{}'", o.beam_stop));
  if (o.max_len < 1) throw UsageError(fmt::format("--max-len must be at least 1, not {}", o.max_len));
  if (o.min_len < 0) throw UsageError(fmt::format("--min-len must be 0 or more, not {}", o.min_len));
  if (o.no_repeat_ngram_size < 0)
    throw UsageError(fmt::format("--no-repeat-ngram-size must be 0 (off) or more, not {}", o.no_repeat_ngram_size));
  if (o.batch_tokens < 0) throw UsageError(fmt::format("--batch-tokens must be 0 or more, not {}", o.batch_tokens));
  if (o.buffer_lines < -1)
    throw UsageError(fmt::format("--buffer-lines must be -1 (automatic), 0 (all) or positive, not {}", o.buffer_lines));
  if (o.batch_sentences < 0)
    throw UsageError(fmt::format("--batch-sentences must be 0 (no cap) or positive, not {}", o.batch_sentences));
  if (o.threads < 1) throw UsageError(fmt::format("--threads must be at least 1, not {}", o.threads));
  if (o.batch_workers < 0 || o.batch_workers > o.threads)
    throw UsageError(fmt::format("--batch-workers must be between 0 and --threads ({}), not {}", o.threads,
                                 o.batch_workers));
  if (o.lowercase_bleu && o.reference.empty()) throw UsageError("--lowercase-bleu needs --reference");
  if (o.sampling && (o.beam > 1 || !o.score.empty() || !o.attention_svg.empty()))
    throw UsageError(fmt::format("--sampling draws one translation per line: {} does not apply",
                                 o.beam > 1 ? "--beam" : !o.score.empty() ? "--score" : "--attention-svg"));
  if (!o.sampling && (o.temperature != 1.0 || o.sampling_topk != 0 || o.sampling_topp != 1.0))
    throw UsageError("--temperature, --sampling-topk and --sampling-topp need --sampling");
  if (!(o.temperature > 0) || !std::isfinite(o.temperature))
    throw UsageError(fmt::format("--temperature must be a positive number, not {}", o.temperature));
  if (o.sampling_topk < 0) throw UsageError(fmt::format("--sampling-topk must be 0 or more, not {}", o.sampling_topk));
  if (!(o.sampling_topp > 0 && o.sampling_topp <= 1))
    throw UsageError(fmt::format("--sampling-topp must be in (0, 1], not {}", o.sampling_topp));
  if (o.seed < 0) throw UsageError(fmt::format("--seed must be 0 or more, not {}", o.seed));
  if (o.shortlist.empty() && (o.shortlist_first != mf::models::DecodingOptions{}.shortlist_first ||
                              o.shortlist_best != mf::models::DecodingOptions{}.shortlist_best))
    throw UsageError("--shortlist-first and --shortlist-best need --shortlist");
  if (o.shortlist_first < 0 || o.shortlist_best < 0)
    throw UsageError(fmt::format("--shortlist-first and --shortlist-best must be 0 or more, not {} and {}",
                                 o.shortlist_first, o.shortlist_best));
  if (!o.shortlist.empty() && !o.score.empty())
    throw UsageError("--score scores given translations: --shortlist does not apply");
  if (!o.score.empty()) {
    const char* other = o.beam > 1 ? "--beam" : o.nbest > 1 ? "--nbest" : !o.reference.empty() ? "--reference"
                        : !o.attention_svg.empty() ? "--attention-svg" : !o.target_prefix.empty() ? "--target-prefix"
                        : o.min_len > 0 ? "--min-len" : o.no_repeat_ngram_size > 0 ? "--no-repeat-ngram-size"
                        : nullptr;
    if (other) throw UsageError(fmt::format("--score scores given translations: {} does not apply", other));
  }
  if (!o.alignment.empty() && o.alignment != "hard" && o.alignment != "soft") {
    char* end = nullptr;
    o.alignment_threshold = std::strtod(o.alignment.c_str(), &end);
    if (*end != '\0' || !(o.alignment_threshold > 0 && o.alignment_threshold < 1))
      throw UsageError(fmt::format("--alignment must be hard, soft or a threshold between 0 and 1, not '{}'",
                                   o.alignment));
  }
  if (o.attention_layer < 0)
    throw UsageError(fmt::format("--attention-layer is 1-based (0: the last), not {}", o.attention_layer));
  if (o.attention_sentence < 1)
    throw UsageError(fmt::format("--attention-sentence is a 1-based line number, not {}", o.attention_sentence));
  if (o.precision != "fp32" && o.precision != "bf16" && o.precision != "int8")
    throw UsageError(fmt::format("--precision: expected fp32, bf16 or int8, got '{}'", o.precision));
  if (o.precision == "int8" && !o.device.is_cpu())
    throw UsageError(fmt::format("--precision int8 runs on the CPU only, not on {}", o.device.str()));
  return true;
}

/// A text file (or stdin) read a group of lines at a time, each line without its '\n' or a trailing '\r'.
class LineReader {
 public:
  /// Reads stdin when `path` is empty; `what` names the file in errors ("input file").
  LineReader(const std::string& path, const char* what) : path_(path), what_(what) {
    if (path.empty()) return;
    if (std::filesystem::is_directory(path)) mf::fail("{} '{}' is a directory", what, path);
    file_.open(path, std::ios::binary);
    if (!file_) mf::fail("cannot open {} '{}': {}", what, path, std::strerror(errno));
    stream_ = &file_;
  }

  /// The next `most` lines, or all that are left when `most` is 0; fewer only at the end of the file.
  std::vector<std::string> read(size_t most) {
    std::vector<std::string> lines;
    while (most == 0 || lines.size() < most) {
      std::string line;
      if (!std::getline(*stream_, line)) {
        if (stream_->bad()) mf::fail("cannot read {} {}: {}", what_, name(), std::strerror(errno));
        at_end_ = true;
        break;
      }
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(std::move(line));
    }
    lines_read_ += static_cast<int64_t>(lines.size());
    return lines;
  }

  /// Whether a read has met the end of the file (a read of exactly the lines left has not yet).
  bool at_end() const { return at_end_; }
  int64_t lines_read() const { return lines_read_; }
  const char* what() const { return what_; }
  /// "stdin" or the path in quotes, for messages.
  std::string name() const { return path_.empty() ? "stdin" : "'" + path_ + "'"; }

 private:
  std::string path_;
  const char* what_;
  std::ifstream file_;
  std::istream* stream_ = &std::cin;
  int64_t lines_read_ = 0;
  bool at_end_ = false;
};

/// Fails once the lines of `file` (one line per input line, read in step with the input or before it)
/// and of the input are known to differ in number: `file` has run out, or both have ended apart.
void check_same_length(const LineReader& file, const LineReader& input) {
  const bool shorter = file.lines_read() < input.lines_read();
  if (!shorter && !(input.at_end() && file.at_end() && file.lines_read() != input.lines_read())) return;
  mf::fail("{} {} has {} lines but the input ({}) has {}{}", file.what(), file.name(), file.lines_read(), input.name(),
           input.at_end() ? "" : "at least ", input.lines_read());
}

/// The lines of `file` beside the input's latest `count` lines; at the input's end, the rest of `file`
/// too, which must be nothing (check_same_length).
std::vector<std::string> read_in_step(LineReader& file, size_t count, const LineReader& input) {
  std::vector<std::string> lines = count > 0 ? file.read(count) : std::vector<std::string>{};
  if (input.at_end() && !file.at_end()) file.read(0);
  check_same_length(file, input);
  return lines;
}

/// The search the flags ask for, as every translation here runs it; `stream` draws the samples.
models::DecodingOptions decoding_options(const Options& o, mf::Generator* stream) {
  return {.beam_size = o.beam,
          .max_new_tokens = o.max_len,
          .length_penalty = o.length_penalty,
          .nbest = o.nbest,
          .batch_tokens = o.batch_tokens,
          .batch_sentences = o.batch_sentences,
          .workers = o.batch_workers,
          .min_new_tokens = o.min_len,
          .no_repeat_ngram_size = o.no_repeat_ngram_size,
          .stop = o.beam_stop == "exact" ? mf::generation::BeamStop::Exact : mf::generation::BeamStop::BeamFinished,
          .sampling = {.do_sample = o.sampling,
                       .temperature = o.temperature,
                       .top_k = o.sampling_topk,
                       .top_p = o.sampling_topp,
                       .generator = stream},
          .shortlist = o.lexicon ? &*o.lexicon : nullptr,
          .shortlist_first = o.shortlist_first,
          .shortlist_best = o.shortlist_best};
}

/// Translates the lines with tokens (the library sorts them by length and batches them under
/// --batch-tokens), each beginning with its prefix (empty: none); lines without tokens (token_counts[i] ==
/// 0) get one empty hypothesis with score 0 per requested translation; --sampling draws from `stream`.
/// Returns the hypotheses in input order and the tokens generated for the best.
std::pair<std::vector<Hypotheses>, int64_t> translate_lines(models::Translator& translator,
                                                            const std::vector<std::string>& lines,
                                                            const std::vector<std::string>& prefixes,
                                                            const std::vector<int64_t>& token_counts,
                                                            mf::Generator& stream, const Options& o) {
  std::vector<Hypotheses> results(lines.size(), Hypotheses(static_cast<size_t>(o.nbest)));
  std::vector<size_t> pending;
  std::vector<std::string> sentences, sentence_prefixes;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (token_counts[i] == 0) continue;
    pending.push_back(i);
    sentences.push_back(lines[i]);
    sentence_prefixes.push_back(prefixes[i]);
  }
  std::vector<std::vector<models::Translation>> translations =
      translator.translate(sentences, decoding_options(o, &stream), sentence_prefixes);
  int64_t generated = 0;
  for (size_t k = 0; k < pending.size(); ++k) {
    generated += translations[k].front().tokens();
    results[pending[k]] = std::move(translations[k]);
  }
  return {std::move(results), generated};
}

/// The batches of every forced pass here (--score, --alignment, --attention-svg): --batch-tokens counts
/// source and target tokens together.
models::ScoringOptions scoring_options(const Options& o) {
  return {.batch_tokens = o.batch_tokens > 0 ? o.batch_tokens : models::kSmallBatchTokens,
          .batch_sentences = o.batch_sentences};
}

/// The decoder layer --alignment and --attention-svg read (1-based, -1 the last).
int64_t attention_layer(const Options& o) { return o.attention_layer == 0 ? -1 : o.attention_layer; }

/// --alignment's text for one translation: "S-T" links, or with soft the weights.
std::string format_alignment(const models::WordAlignment& alignment, const Options& o) {
  std::string text;
  if (o.alignment == "soft") {
    for (int64_t t = 0; t < alignment.target_words; ++t) {
      if (t > 0) text += ' ';
      for (int64_t s = 0; s < alignment.source_words; ++s)
        text += mf::format_message("{}{:.4f}", s > 0 ? "," : "", alignment.weight(t, s));
    }
    return text;
  }
  for (const models::AlignmentLink& link :
       o.alignment == "hard" ? alignment.hard() : alignment.above(o.alignment_threshold))
    text += mf::format_message("{}{}-{}", text.empty() ? "" : " ", link.source, link.target);
  return text;
}

/// --alignment's text for every hypothesis of `results` (translations of `lines`), in their order; lines
/// without tokens (token_counts[i] == 0) get empty texts.
std::vector<std::vector<std::string>> align_lines(models::Translator& translator, const std::vector<std::string>& lines,
                                                  const std::vector<Hypotheses>& results,
                                                  const std::vector<int64_t>& token_counts, const Options& o) {
  std::vector<std::string> sources;
  std::vector<std::vector<int64_t>> targets;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (token_counts[i] == 0) continue;
    for (const models::Translation& t : results[i]) {
      sources.push_back(lines[i]);
      targets.push_back(t.ids);
    }
  }
  const std::vector<models::WordAlignment> alignments =
      translator.align(sources, targets, attention_layer(o), scoring_options(o));
  std::vector<std::vector<std::string>> out(lines.size());
  size_t next = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    out[i].resize(results[i].size());
    if (token_counts[i] == 0) continue;
    for (std::string& text : out[i]) text = format_alignment(alignments[next++], o);
  }
  return out;
}

/// The output text: one line per sentence, or "score<TAB>translation" lines with --nbest K > 1; each
/// followed by " ||| " and its alignment where `alignments` are given.
std::string format_output(const std::vector<Hypotheses>& results, const std::vector<std::vector<std::string>>& alignments,
                          int64_t nbest) {
  std::string text;
  for (size_t i = 0; i < results.size(); ++i) {
    for (size_t k = 0; k < results[i].size(); ++k) {
      const models::Translation& t = results[i][k];
      text += nbest == 1 ? t.text : mf::format_message("{:.4f}\t{}", t.score, t.text);
      text += alignments.empty() ? "\n" : " ||| " + alignments[i][k] + "\n";
    }
  }
  return text;
}

/// sacreBLEU's corpus BLEU and chrF lines for the best translations, as printed, against the reference lines.
std::string score_lines(const std::vector<std::string>& best, const std::vector<std::string>& references,
                        const Options& o) {
  return fmt::format("{}\n{}\n", mf::text::corpus_sacrebleu(best, references, {.lowercase = o.lowercase_bleu}).str(),
                     mf::text::corpus_chrf(best, references).str());
}

/// --score: the "LOGPROB<TAB>TOKENS" lines of each target line as the translation of its source line
/// (with --alignment, " ||| " and the pair's alignment after each), and the tokens scored.
std::pair<std::string, int64_t> forced_scores(models::Translator& translator, const std::vector<std::string>& sources,
                                              const std::vector<std::string>& targets, const Options& o) {
  const std::vector<models::TargetScore> scores = translator.score(sources, targets, scoring_options(o));
  std::vector<models::WordAlignment> alignments;
  if (!o.alignment.empty()) {
    std::vector<std::vector<int64_t>> target_ids;
    for (const std::string& target : targets) target_ids.push_back(translator.target().encode(target));
    alignments = translator.align(sources, target_ids, attention_layer(o), scoring_options(o));
  }
  std::string text;
  int64_t tokens = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    text += mf::format_message("{:.4f}\t{}", scores[i].log_prob, scores[i].token_log_probs.size());
    text += alignments.empty() ? "\n" : " ||| " + format_alignment(alignments[i], o) + "\n";
    tokens += static_cast<int64_t>(scores[i].token_log_probs.size());
  }
  return {std::move(text), tokens};
}

/// The generated ids of `sentence` (no <sos>; <eos> last unless the length ran out), decoded as the
/// tool decodes it: the best of the same search, from the same target prefix.
std::vector<int64_t> decode_ids(models::Translator& translator, const std::string& sentence, const std::string& prefix,
                                const Options& o) {
  models::DecodingOptions options = decoding_options(o, nullptr);
  options.nbest = 1;
  options.banned_ids = translator.banned_tokens();
  options.target_prefixes = {translator.target().encode(prefix)};
  return models::decode_sources(translator.models(), {translator.source().encode(sentence)}, options)
      .front()
      .front()
      .tokens;
}

/// The cross-attention heatmap of one sentence: translate it, read --attention-layer's cross-attention
/// over the translation (models::target_cross_attention: mean over heads), and draw it.
std::string attention_svg(models::Translator& translator, const std::string& sentence, const std::string& prefix,
                          const Options& o) {
  std::vector<int64_t> ids = decode_ids(translator, sentence, prefix, o);
  if (!ids.empty() && ids.back() == mf::text::kEosId) ids.pop_back();
  models::Transformer& model = translator.model();
  const mf::Tensor mean =  // [T, S]
      models::target_cross_attention(model, {translator.source().encode(sentence)}, {ids}, attention_layer(o)).front();
  int64_t rows = mean.size(0), columns = mean.size(1);
  std::vector<double> flat = mean.to_vector<double>();

  std::vector<std::string> column_labels;
  // The source's words or pieces, one per id (unknown words marked), truncated like the source.
  const std::vector<std::string> units = translator.source().units(sentence);
  const std::vector<int64_t> unit_ids = translator.source().encode(sentence);
  for (size_t i = 0; i < units.size() && static_cast<int64_t>(column_labels.size()) < columns - 1; ++i)
    column_labels.push_back(unit_ids[i] == mf::text::kUnkId ? units[i] + " (unk)" : units[i]);
  column_labels.emplace_back("<eos>");
  std::vector<std::string> row_labels;
  for (int64_t t = 0; t < rows - 1; ++t) row_labels.push_back(translator.target().unit(ids[static_cast<size_t>(t)]));
  row_labels.emplace_back("<eos>");
  std::vector<std::vector<double>> values;
  for (int64_t r = 0; r < rows; ++r) values.emplace_back(flat.begin() + r * columns, flat.begin() + (r + 1) * columns);
  const int64_t layer = o.attention_layer == 0 ? model.config().decoder_layers : o.attention_layer;
  std::string title =
      fmt::format("cross-attention, decoder layer {} (mean of {} heads): {}", layer, model.config().heads, sentence);
  return mf::train::heatmap_svg(title, row_labels, column_labels, values);
}

/// Where the output goes: stdout, flushed after each group of lines so that whoever reads it gets each
/// translation as soon as it is made, or --output, put in place atomically once the whole input is done.
class Output {
 public:
  explicit Output(const Options& o) {
    if (!o.output.empty()) file_.emplace(o.output, o.score.empty() ? "translations" : "scores");
  }

  void write(const std::string& text) {
    if (file_) return file_->write(text);
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (std::fflush(stdout) != 0) mf::fail("cannot write the output to stdout: {}", std::strerror(errno));
  }

  void finish() {
    if (file_) file_->commit();
  }

 private:
  std::optional<mf::AtomicFile> file_;
};

/// The input lines translated together: --buffer-lines, or by default a terminal's lines one at a time
/// (each translated once typed) and other input kBufferLines at a time.
size_t lines_per_group(const Options& o) {
  if (o.buffer_lines >= 0) return static_cast<size_t>(o.buffer_lines);
  return o.input.empty() && isatty(STDIN_FILENO) ? 1 : kBufferLines;
}

/// What the whole run did, for the messages at its end.
struct Totals {
  int64_t sentences = 0, tokens = 0, truncated_sources = 0, truncated_targets = 0;
  double seconds = 0;  // translating or scoring only, not reading and writing
};

/// --timing's lines on stderr: the speed, and when translating, the CPU allocator's pool while decoding
/// (memory it took from the system is memory the kernel had to clear on first touch, a cost of its own
/// in short runs).
void print_timing(const Totals& totals, bool scoring, const mf::AllocatorStats& memory_before) {
  const double tokens_per_second = static_cast<double>(totals.tokens) / totals.seconds;
  if (scoring) {
    fmt::print(stderr, "translate: {} pairs scored, {} target tokens in {:.3f} s: {:.0f} tokens/s\n", totals.sentences,
               totals.tokens, totals.seconds, tokens_per_second);
    return;
  }
  fmt::print(stderr, "translate: {} sentences, {} tokens in {:.3f} s: {:.0f} tokens/s, {:.1f} sentences/s\n",
             totals.sentences, totals.tokens, totals.seconds, tokens_per_second,
             static_cast<double>(totals.sentences) / totals.seconds);
  const mf::AllocatorStats memory = mf::memory_stats(mf::Device::cpu());
  fmt::print(stderr,
             "translate: CPU tensors peaked at {:.1f} MB, {:.1f} MB held by the allocator; {} of {} blocks new "
             "from the system\n",
             static_cast<double>(memory.peak_allocated_bytes) / 1e6, static_cast<double>(memory.reserved_bytes()) / 1e6,
             memory.system_allocations - memory_before.system_allocations,
             memory.allocations - memory_before.allocations);
}

/// The number of `lines` with more units than `limit` under `codec`.
int64_t count_longer(const std::vector<std::string>& lines, const mf::text::TextCodec& codec, int64_t limit) {
  return std::count_if(lines.begin(), lines.end(),
                       [&](const std::string& line) { return static_cast<int64_t>(codec.units(line).size()) > limit; });
}

int run(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, o)) return 0;
  mf::tools::check_device_available(o.device, "--device");
  const bool int8 = o.precision == "int8";
  mf::AutocastGuard autocast(o.device.type, mf::DType::BFloat16,
                             !int8 && mf::tools::autocast_from_precision_flag(o.precision, o.device));
  mf::set_num_threads(o.threads);

  models::Translator translator = models::Translator::load(o.checkpoint);
  for (const std::string& path : o.ensemble) {
    models::Translator member = models::Translator::load(path);
    try {
      translator.add_ensemble_member(std::move(member));
    } catch (const mf::Error& e) {
      mf::fail("--ensemble '{}' cannot decode beside '{}': {}", path, o.checkpoint, e.what());
    }
  }
  if (int8) translator.quantize_int8();
  if (o.attention_layer > translator.model().config().decoder_layers)
    throw UsageError(fmt::format("--attention-layer {}: '{}' has {} decoder layers", o.attention_layer, o.checkpoint,
                                 translator.model().config().decoder_layers));
  if (translator.is_quantized() && !o.device.is_cpu())
    mf::fail("'{}' holds int8 weights, which run on the CPU only (not on {})", o.checkpoint, o.device.str());
  for (models::Transformer* model : translator.models()) model->to(o.device);
  if (!o.shortlist.empty()) o.lexicon = mf::text::Lexicon::load(o.shortlist, translator.source(), translator.target());
  // What loading (and quantizing) left in the CPU allocator's pool (the file's tensors, the float32
  // weights int8 replaced) is in blocks of the weights' sizes, which decoding's requests rarely fit.
  mf::empty_cache();
  mf::reset_peak_memory_stats(mf::Device::cpu());
  const mf::AllocatorStats memory_before = mf::memory_stats(mf::Device::cpu());

  LineReader input(o.input, "input file");
  std::optional<LineReader> references, targets, prefixes;
  std::vector<std::string> reference_lines;
  if (!o.reference.empty()) {
    references.emplace(o.reference, "reference file");
    reference_lines = references->read(0);
  }
  if (!o.score.empty()) targets.emplace(o.score, "file to score");
  if (!o.target_prefix.empty()) prefixes.emplace(o.target_prefix, "target prefix file");
  Output output(o);
  mf::Generator stream(static_cast<uint64_t>(o.seed));
  const int64_t limit = models::shortest_max_len(translator.models()) - 1;
  const size_t group_lines = lines_per_group(o);
  Totals totals;
  std::vector<std::string> best;  // the first translation of every line, for --reference
  std::string attention_line, attention_prefix;  // the line --attention-svg draws, and its --target-prefix
  do {
    const int64_t first_line = input.lines_read();
    std::vector<std::string> lines = input.read(group_lines);
    // What is known of the whole input is checked before this group is translated.
    if (references) check_same_length(*references, input);
    const std::vector<std::string> target_lines = targets ? read_in_step(*targets, lines.size(), input)
                                                          : std::vector<std::string>{};
    const std::vector<std::string> prefix_lines = prefixes ? read_in_step(*prefixes, lines.size(), input)
                                                           : std::vector<std::string>(lines.size());
    std::vector<int64_t> token_counts;
    for (const std::string& line : lines)
      token_counts.push_back(static_cast<int64_t>(translator.source().units(line).size()));
    if (!o.attention_svg.empty()) {
      const int64_t index = o.attention_sentence - 1 - first_line;
      if (index >= 0 && index < static_cast<int64_t>(lines.size())) {
        if (token_counts[index] == 0)
          mf::fail("--attention-sentence {}: that line of the input ({}) is empty", o.attention_sentence, input.name());
        attention_line = lines[index];
        attention_prefix = prefix_lines[index];
      }
      if (input.at_end() && o.attention_sentence > input.lines_read())
        mf::fail("--attention-sentence {}: the input ({}) has only {} lines", o.attention_sentence, input.name(),
                 input.lines_read());
    }
    totals.truncated_sources += std::count_if(token_counts.begin(), token_counts.end(), [&](int64_t n) { return n > limit; });

    const auto start = std::chrono::steady_clock::now();
    if (targets) {
      totals.truncated_targets += count_longer(target_lines, translator.target(), limit);
      auto [text, tokens] = forced_scores(translator, lines, target_lines, o);
      output.write(text);
      totals.sentences += static_cast<int64_t>(lines.size());
      totals.tokens += tokens;
    } else {
      auto [results, generated] = translate_lines(translator, lines, prefix_lines, token_counts, stream, o);
      const std::vector<std::vector<std::string>> alignments =
          o.alignment.empty() ? std::vector<std::vector<std::string>>{}
                              : align_lines(translator, lines, results, token_counts, o);
      output.write(format_output(results, alignments, o.nbest));
      if (references)
        for (const Hypotheses& hypotheses : results) best.push_back(hypotheses.front().text);
      totals.sentences += std::count_if(token_counts.begin(), token_counts.end(), [](int64_t n) { return n > 0; });
      totals.tokens += generated;
    }
    totals.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (!input.at_end());
  output.finish();

  if (totals.truncated_sources > 0)
    fmt::print(stderr, "translate: {} sentence(s) longer than the model's {} tokens were truncated\n",
               totals.truncated_sources, limit);
  if (totals.truncated_targets > 0)
    fmt::print(stderr, "translate: {} target(s) longer than the model's {} tokens were scored on their first {}\n",
               totals.truncated_targets, limit, limit);
  if (o.timing) print_timing(totals, !o.score.empty(), memory_before);
  if (references) fmt::print(stderr, "{}", score_lines(best, reference_lines, o));
  if (!o.attention_svg.empty())
    mf::write_file_atomic(o.attention_svg, attention_svg(translator, attention_line, attention_prefix, o),
                          "attention chart");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return mf::tools::run_tool("translate", [&] { return run(argc, argv); }); }
