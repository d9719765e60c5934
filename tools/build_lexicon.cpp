// tools/build_lexicon: the lexical translation table a translation model's shortlist needs (`translate
// --shortlist LEXICON`), learned from a parallel corpus as the checkpoint's codecs split it: IBM Model 1,
// or fast_align's Model 2 with --diagonal-tension (text::Lexicon, models::Translator::train_lexicon), each
// source unit's most probable translations written as Marian's lex.s2t text ("target source probability"
// a line).
//
//   build_lexicon --checkpoint model.safetensors --source train.de --target train.en --output lex.s2t
//   build_lexicon ... --diagonal-tension 4 --optimize-tension --dirichlet-alpha 0.01   (fast_align -d -o -v)
//
// Exit status: 0 on success, 2 on bad usage (a missing flag, an option out of range), 1 on any other
// error (a missing or corrupt checkpoint, unreadable or misaligned corpus files, an unwritable output).
#include "miniflow.h"
#include "tools/cli.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>

namespace {

int run(int argc, char** argv) {
  std::filesystem::path checkpoint, source, target, output;
  mf::text::LexiconOptions options;
  mf::tools::ArgParser args("build_lexicon",
                            "Learns the lexical translation table t(target unit | source unit) of a parallel corpus "
                            "with IBM Model 1\n(or fast_align's Model 2: --diagonal-tension), as --checkpoint's codecs "
                            "split its lines, and\nwrites each source unit's most probable translations to --output "
                            "(Marian's lex.s2t text)\nfor `translate --shortlist`.");
  args.add("checkpoint", &checkpoint, "the translation checkpoint whose codecs split the corpus");
  args.add("source", &source, "the corpus's source side, a sentence a line");
  args.add("target", &target, "its target side, line i translating line i of --source");
  args.add("output", &output, "the lexicon to write, atomically");
  args.add("iterations", &options.iterations, "expectation-maximization passes");
  args.add("keep", &options.keep, "translations kept per source unit, the most probable");
  args.add("min-probability", &options.min_probability,
           "translations less probable than this are dropped");
  args.add("diagonal-tension", &options.diagonal_tension,
           "fast_align's preference for source units across from the target unit (its -d; it starts at 4); 0: "
           "IBM Model 1");
  args.add_switch("optimize-tension", &options.optimize_tension,
                  "re-estimate --diagonal-tension after each pass (fast_align's -o)");
  args.add("null-probability", &options.null_probability,
           "with --diagonal-tension: the prior probability of a target unit coming from NULL (fast_align's -p0)");
  args.add("dirichlet-alpha", &options.dirichlet_alpha,
           "variational Bayes under a Dirichlet prior of this concentration (fast_align's -v -a, 0.01): sparser "
           "tables; 0: plain EM");
  if (!args.parse(argc, argv)) return 0;
  for (const auto& [flag, value] : {std::pair{"--checkpoint", &checkpoint}, std::pair{"--source", &source},
                                    std::pair{"--target", &target}, std::pair{"--output", &output}})
    if (value->empty()) throw mf::tools::UsageError(fmt::format("{} is required", flag));
  if (options.iterations < 1)
    throw mf::tools::UsageError(fmt::format("--iterations must be at least 1, not {}", options.iterations));
  if (options.keep < 1) throw mf::tools::UsageError(fmt::format("--keep must be at least 1, not {}", options.keep));
  if (!(options.min_probability > 0 && options.min_probability <= 1))
    throw mf::tools::UsageError(fmt::format("--min-probability must be in (0, 1], not {}", options.min_probability));
  if (!(options.diagonal_tension >= 0 && std::isfinite(options.diagonal_tension)))
    throw mf::tools::UsageError(fmt::format("--diagonal-tension must be 0 or more, not {}", options.diagonal_tension));
  if (options.optimize_tension && options.diagonal_tension == 0)
    throw mf::tools::UsageError("--optimize-tension needs a --diagonal-tension to start from");
  if (!(options.null_probability >= 0 && options.null_probability < 1))
    throw mf::tools::UsageError(fmt::format("--null-probability must be in [0, 1), not {}", options.null_probability));
  if (!(options.dirichlet_alpha >= 0 && std::isfinite(options.dirichlet_alpha)))
    throw mf::tools::UsageError(fmt::format("--dirichlet-alpha must be 0 or more, not {}", options.dirichlet_alpha));

  options.on_pass = [&](const mf::text::LexiconPass& pass) {
    fmt::print("pass {}: perplexity {:.2f}", pass.pass, pass.perplexity());
    if (options.diagonal_tension > 0) fmt::print(", diagonal tension {:.3f} next", pass.diagonal_tension);
    fmt::print("\n");
  };
  const auto start = std::chrono::steady_clock::now();
  const mf::models::Translator translator = mf::models::Translator::load(checkpoint);
  const mf::text::Corpus corpus = mf::text::read_parallel_corpus(source, target, {.skip_empty = true});
  const mf::text::Lexicon lexicon = translator.train_lexicon(corpus, options);
  lexicon.save(output, translator.source(), translator.target());
  fmt::print("{} pairs, {} source units with translations, written to '{}' in {:.1f} s\n", corpus.stats.pairs,
             lexicon.sources(), output.string(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mf::tools::run_tool("build_lexicon", [&] { return run(argc, argv); });
}
