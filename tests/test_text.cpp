#include <doctest/doctest.h>

#include "miniflow.h"

#include <algorithm>
#include <fstream>
#include <random>
#include <set>

namespace {

using Tokens = std::vector<std::string>;
namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device entropy;
    path = fs::temp_directory_path() / fmt::format("miniflow-text-{:08x}{:08x}", entropy(), entropy());
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  fs::path write(const std::string& name, const std::string& content) const {
    std::ofstream(path / name, std::ios::binary) << content;
    return path / name;
  }
};

}  // namespace

// Token lists print as {"a", "b"} in failed checks.
template <>
struct doctest::StringMaker<std::vector<std::string>> {
  static String convert(const std::vector<std::string>& tokens) {
    std::string text = "{";
    for (size_t i = 0; i < tokens.size(); ++i) text += (i > 0 ? ", \"" : "\"") + tokens[i] + "\"";
    return (text + "}").c_str();
  }
};

// ---------------------------------------------------------------------------------------------
// Tokenizer

TEST_CASE("tokenizer splits punctuation and lowercases ASCII") {
  const mf::text::Tokenizer tokenizer;
  CHECK(tokenizer.tokenize("Hello, World! It's 3.5") ==
        Tokens{"hello", ",", "world", "!", "it", "'", "s", "3", ".", "5"});
  CHECK(tokenizer.tokenize("").empty());
  CHECK(tokenizer.tokenize(" \t\n ").empty());
}

TEST_CASE("tokenizer lowercases German umlauts and Latin letters, keeping ß") {
  const mf::text::Tokenizer tokenizer;
  CHECK(tokenizer.tokenize("Über den ÄRGER mit ÖL in der STRAßE") ==
        Tokens{"über", "den", "ärger", "mit", "öl", "in", "der", "straße"});
  CHECK(tokenizer.tokenize("École ÇA ÑANDÚ ØRE Þorn") == Tokens{"école", "ça", "ñandú", "øre", "þorn"});
  CHECK(tokenizer.tokenize("ŁÓDŹ ŻÓŁW ČEŠKÝ ŐRÜLT Ÿ İ") == Tokens{"łódź", "żółw", "češký", "őrült", "ÿ", "i"});
  CHECK(tokenizer.tokenize("ΑΘΉΝΑ МОСКВА ЁЖ") == Tokens{"αθήνα", "москва", "ёж"});
  CHECK(tokenizer.tokenize("2×3") == Tokens{"2×3"});  // × sits among the Latin-1 capitals but has no case
}

TEST_CASE("tokenizer splits Unicode quotes and punctuation off words") {
  const mf::text::Tokenizer tokenizer;
  CHECK(tokenizer.tokenize("„Guten Morgen“, sagte sie…") ==
        Tokens{"„", "guten", "morgen", "“", ",", "sagte", "sie", "…"});
  CHECK(tokenizer.tokenize("¿Qué? ¡Sí! «oui» ‘x’ “y” a–b c—d 5€") ==
        Tokens{"¿", "qué", "?", "¡", "sí", "!", "«", "oui", "»", "‘", "x", "’", "“", "y", "”", "a", "–", "b", "c", "—",
               "d", "5", "€"});
}

TEST_CASE("tokenizer splits on Unicode whitespace, including no-break spaces") {
  const mf::text::Tokenizer tokenizer;
  // U+00A0 no-break space, U+202F narrow no-break space, U+2003 em space, U+3000 ideographic space,
  // U+200B zero-width space, U+FEFF byte order mark; then tab, CR LF.
  CHECK(tokenizer.tokenize("\xEF\xBB\xBF" "a\u00A0b\u202Fc\u2003d\u3000e\u200Bf\tg\r\nh") ==
        Tokens{"a", "b", "c", "d", "e", "f", "g", "h"});
  CHECK(tokenizer.tokenize("10\u00A0000 km") == Tokens{"10", "000", "km"});
}

TEST_CASE("tokenizer options turn lowercasing and punctuation splitting off") {
  CHECK(mf::text::Tokenizer({.lowercase = false}).tokenize("Über „Ä“") == Tokens{"Über", "„", "Ä", "“"});
  CHECK(mf::text::Tokenizer({.split_punctuation = false}).tokenize("Hallo, Welt!") == Tokens{"hallo,", "welt!"});
}

TEST_CASE("tokenizer replaces each invalid UTF-8 byte with U+FFFD") {
  const mf::text::Tokenizer tokenizer;
  const std::string replacement = "\uFFFD";
  // A Latin-1 "ü" (0xFC) inside a UTF-8 line: one bad byte, one replacement, the word stays whole.
  CHECK(tokenizer.tokenize("gr\xFC\xDF" "e dich") == Tokens{"gr" + replacement + replacement + "e", "dich"});
  CHECK(tokenizer.tokenize("caf\xC3") == Tokens{"caf" + replacement});                   // truncated at the end
  CHECK(tokenizer.tokenize("\xC3 x") == Tokens{replacement, "x"});                       // truncated before a space
  CHECK(tokenizer.tokenize("\xC0\xAF") == Tokens{replacement + replacement});            // overlong "/"
  CHECK(tokenizer.tokenize("\xED\xA0\x80") == Tokens{replacement + replacement + replacement});  // surrogate
  CHECK(tokenizer.tokenize("\xF4\x90\x80\x80") == Tokens{replacement + replacement + replacement + replacement});
  CHECK(tokenizer.tokenize("\x80 ok") == Tokens{replacement, "ok"});                     // stray continuation

  CHECK(mf::text::find_invalid_utf8("grüße „x“ 😀") == std::string_view::npos);
  CHECK(mf::text::find_invalid_utf8("ab\xFF") == 2);
  CHECK(mf::text::find_invalid_utf8("ü\xE2\x80") == 2);
}

TEST_CASE("detokenize joins tokens with spaces") {
  CHECK(mf::text::Tokenizer::detokenize({"hallo", ",", "welt", "!"}) == "hallo , welt !");
  CHECK(mf::text::Tokenizer::detokenize({}).empty());
}

// ---------------------------------------------------------------------------------------------
// Vocabulary

namespace {
mf::text::TokenCounts sample_counts() { return {{"a", 5}, {"b", 3}, {"c", 3}, {"d", 1}, {"<unk>", 9}, {"äpfel", 3}}; }
}  // namespace

TEST_CASE("vocab has the specials at fixed ids") {
  const mf::text::Vocab vocab;
  CHECK(vocab.size() == 4);
  CHECK(vocab.id("<pad>") == mf::text::kPadId);
  CHECK(vocab.id("<sos>") == mf::text::kSosId);
  CHECK(vocab.id("<eos>") == mf::text::kEosId);
  CHECK(vocab.id("<unk>") == mf::text::kUnkId);
  CHECK((mf::text::kPadId == 0 && mf::text::kSosId == 1 && mf::text::kEosId == 2 && mf::text::kUnkId == 3));
}

TEST_CASE("vocab build applies min_freq and max_size, most frequent first, ties alphabetical") {
  // "<unk>" in the text maps to the special instead of a second entry; b, c and äpfel tie at 3 and
  // are ordered by bytes (ä is 0xC3 0xA4, after ASCII).
  const mf::text::Vocab all = mf::text::Vocab::build(sample_counts());
  CHECK(all.tokens() == Tokens{"<pad>", "<sos>", "<eos>", "<unk>", "a", "b", "c", "äpfel", "d"});
  CHECK(mf::text::Vocab::build(sample_counts(), {.min_freq = 2}).tokens() ==
        Tokens{"<pad>", "<sos>", "<eos>", "<unk>", "a", "b", "c", "äpfel"});
  CHECK(mf::text::Vocab::build(sample_counts(), {.min_freq = 2, .max_size = 6}).tokens() ==
        Tokens{"<pad>", "<sos>", "<eos>", "<unk>", "a", "b"});
  CHECK(mf::text::Vocab::build(sample_counts(), {.max_size = 4}).size() == 4);
}

TEST_CASE("vocab build is deterministic whatever the hash map's order") {
  mf::text::TokenCounts forward, backward;
  backward.reserve(1000);  // a different bucket count gives a different iteration order
  std::vector<std::string> words;
  for (int i = 0; i < 200; ++i) words.push_back(fmt::format("w{}", i));
  for (size_t i = 0; i < words.size(); ++i) forward[words[i]] = static_cast<int64_t>(i % 7);
  for (size_t i = words.size(); i-- > 0;) backward[words[i]] = static_cast<int64_t>(i % 7);
  CHECK(mf::text::Vocab::build(forward, {.max_size = 50}) == mf::text::Vocab::build(backward, {.max_size = 50}));
}

TEST_CASE("vocab counts tokens, encodes and decodes") {
  mf::text::TokenCounts counts;
  mf::text::count_tokens({{"der", "hund"}, {"der", "ball", "."}}, counts);
  CHECK(counts == mf::text::TokenCounts{{"der", 2}, {"hund", 1}, {"ball", 1}, {".", 1}});
  const mf::text::Vocab vocab = mf::text::Vocab::build(counts);  // der=4, then ". ball hund" = 5, 6, 7
  CHECK(vocab.encode({"der", "katze", "."}) == std::vector<int64_t>{4, mf::text::kUnkId, 5});
  CHECK(vocab.encode({"hund"}, {.add_sos = true, .add_eos = true}) == std::vector<int64_t>{1, 7, 2});
  CHECK(vocab.contains("hund"));
  CHECK(!vocab.contains("katze"));
  CHECK(vocab.token(6) == "ball");

  const std::vector<int64_t> ids{1, 4, 0, 3, 7, 2, 6, 6};  // <sos> der <pad> <unk> hund <eos> ball ball
  CHECK(vocab.decode(ids) == Tokens{"der", "<unk>", "hund"});
  CHECK_THROWS_WITH_AS(vocab.decode(std::vector<int64_t>{4, 8}),
                       "Vocab::decode: id 8 at position 1 is out of range for a vocabulary of 8 tokens", mf::Error);
  CHECK_THROWS_WITH_AS(vocab.token(-1), "Vocab::token: id -1 is out of range for a vocabulary of 8 tokens", mf::Error);
}

TEST_CASE("vocab build rejects bad options and tokens") {
  CHECK_THROWS_WITH_AS(mf::text::Vocab::build(sample_counts(), {.min_freq = 0}),
                       "Vocab::build: min_freq must be at least 1, got 0", mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Vocab::build(sample_counts(), {.max_size = 3}),
                       "Vocab::build: max_size must be 0 (no limit) or at least 4 (the special tokens), got 3",
                       mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Vocab::build({{"ab\xFF", 1}}),
                       "Vocab::build: token \"ab...\" is not valid UTF-8 (byte 0xFF at offset 2)", mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Vocab::build({{"", 1}}), "Vocab::build: the counts hold an empty token", mf::Error);
}

TEST_CASE("vocab round-trips through JSON strings and files") {
  const mf::text::Vocab vocab = mf::text::Vocab::build(sample_counts());
  CHECK(mf::text::Vocab::from_json(vocab.to_json()) == vocab);

  TempDir dir;
  const fs::path path = dir.path / "vocab.json";
  vocab.save(path);
  mf::text::Vocab{}.save(path);  // overwriting works, and replaces the content
  CHECK(mf::text::Vocab::load(path) == mf::text::Vocab{});
  vocab.save(path);
  CHECK(mf::text::Vocab::load(path) == vocab);
  // The temporary file was renamed into place, not left behind.
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE("vocab loading reports corrupt files by name") {
  TempDir dir;
  auto load = [&](const std::string& name, const std::string& content) {
    return mf::text::Vocab::load(dir.write(name, content));
  };
  const std::string good_specials = R"("<pad>", "<sos>", "<eos>", "<unk>")";
  auto file = [&](const std::string& name) { return (dir.path / name).string(); };

  const std::string bad_json = "vocab from file '" + file("bad.json") + "': invalid JSON (";
  CHECK_THROWS_WITH_AS(load("bad.json", "{\"tokens\": [1,"), doctest::Contains(bad_json.c_str()), mf::Error);
  CHECK_THROWS_WITH_AS(load("list.json", "[]"),
                       ("vocab from file '" + file("list.json") + "': expected a JSON object, got array").c_str(),
                       mf::Error);
  CHECK_THROWS_WITH_AS(
      load("format.json", R"({"tokens": []})"),
      ("vocab from file '" + file("format.json") + "': \"format\" is missing or not \"miniflow-vocab\"").c_str(),
      mf::Error);
  CHECK_THROWS_WITH_AS(
      load("version.json", R"({"format": "miniflow-vocab", "version": 2, "tokens": []})"),
      ("vocab from file '" + file("version.json") + "': \"version\" is 2 (this build reads version 1)").c_str(),
      mf::Error);
  CHECK_THROWS_WITH_AS(
      load("order.json", R"({"format": "miniflow-vocab", "version": 1, "tokens": ["<pad>", "<sos>", "<unk>"]})"),
      ("vocab from file '" + file("order.json") + "': id 2 must be the special token \"<eos>\", found \"<unk>\"")
          .c_str(),
      mf::Error);
  CHECK_THROWS_WITH_AS(
      load("short.json", R"({"format": "miniflow-vocab", "version": 1, "tokens": ["<pad>", "<sos>"]})"),
      ("vocab from file '" + file("short.json") + "': the special token \"<eos>\" is missing (expected at id 2)")
          .c_str(),
      mf::Error);
  CHECK_THROWS_WITH_AS(
      load("dup.json", R"({"format": "miniflow-vocab", "version": 1, "tokens": [)" + good_specials +
                           R"(, "x", "y", "x"]})"),
      ("vocab from file '" + file("dup.json") + "': duplicate token \"x\" at ids 4 and 6").c_str(), mf::Error);
  CHECK_THROWS_WITH_AS(
      load("type.json", R"({"format": "miniflow-vocab", "version": 1, "tokens": [)" + good_specials + R"(, 7]})"),
      ("vocab from file '" + file("type.json") + "': token at id 4 is a number, not a string").c_str(), mf::Error);
  // Found by fuzz_vocab: a number too big for a double is nlohmann's out_of_range, not a parse_error.
  CHECK_THROWS_WITH_AS(load("huge_number.json", R"({"format": 1e400, "version": 1, "tokens": []})"),
                       doctest::Contains(("vocab from file '" + file("huge_number.json") +
                                          "': invalid JSON ([json.exception.out_of_range.406] number overflow parsing "
                                          "'1e400')")
                                             .c_str()),
                       mf::Error);
  // A million nested arrays: the message must describe the value, not dump it (recursion per level
  // overflowed the stack).
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  CHECK_THROWS_WITH_AS(mf::text::Vocab::from_json(R"({"format": "miniflow-vocab", "version": )" + deep + "}", "deep"),
                       "vocab from deep: \"version\" is a JSON array of size 1 (this build reads version 1)", mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Vocab::load(dir.path / "missing.json"),
                       ("Vocab::load: '" + file("missing.json") + "' does not exist").c_str(), mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Vocab::from_json("{}", "my string"),
                       "vocab from my string: \"format\" is missing or not \"miniflow-vocab\"", mf::Error);
}

// ---------------------------------------------------------------------------------------------
// Corpus

TEST_CASE("corpus reads line-aligned files") {
  TempDir dir;
  // CRLF line ends and a last line without a newline are both fine.
  const fs::path source = dir.write("train.de", "Guten Morgen!\r\n„Danke“, sagte er.\r\nJa");
  const fs::path target = dir.write("train.en", "Good morning!\n\"Thanks,\" he said.\nYes\n");
  const mf::text::Corpus corpus = mf::text::read_parallel_corpus(source, target);
  CHECK(corpus.sources ==
        std::vector<Tokens>{{"guten", "morgen", "!"}, {"„", "danke", "“", ",", "sagte", "er", "."}, {"ja"}});
  CHECK(corpus.targets ==
        std::vector<Tokens>{{"good", "morning", "!"}, {"\"", "thanks", ",", "\"", "he", "said", "."}, {"yes"}});
  CHECK(corpus.stats.pairs == 3);
  CHECK(corpus.stats.skipped_empty == 0);
}

TEST_CASE("corpus truncates to max_length and counts truncated sentences") {
  const mf::text::Corpus corpus = mf::text::make_corpus({{"a b c d", "w x"}, {"a b", "w x y z"}, {"a b c", "w x y"}},
                                            {.max_length = 3});
  CHECK(corpus.sources == std::vector<Tokens>{{"a", "b", "c"}, {"a", "b"}, {"a", "b", "c"}});
  CHECK(corpus.targets == std::vector<Tokens>{{"w", "x"}, {"w", "x", "y"}, {"w", "x", "y"}});
  CHECK(corpus.stats.truncated_sources == 1);
  CHECK(corpus.stats.truncated_targets == 1);
  CHECK_THROWS_WITH_AS(mf::text::make_corpus({}, {.max_length = -1}),
                       "corpus: max_length must be 0 (no limit) or positive, got -1", mf::Error);
}

TEST_CASE("corpus reports files of different lengths with both counts") {
  TempDir dir;
  const fs::path three = dir.write("three.txt", "a\nb\nc\n");
  const fs::path five = dir.write("five.txt", "a\nb\nc\nd\ne");
  CHECK_THROWS_WITH_AS(mf::text::read_parallel_corpus(three, five),
                       fmt::format("read_parallel_corpus: source file '{}' has 3 lines but target file '{}' has 5; "
                                   "'{}' ends after line 3",
                                   three.string(), five.string(), three.string())
                           .c_str(),
                       mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::read_parallel_corpus(five, three),
                       fmt::format("read_parallel_corpus: source file '{}' has 5 lines but target file '{}' has 3; "
                                   "'{}' ends after line 3",
                                   five.string(), three.string(), three.string())
                           .c_str(),
                       mf::Error);
}

TEST_CASE("corpus rejects blank lines, or skips and counts them") {
  TempDir dir;
  const fs::path source = dir.write("src.txt", "eins\nzwei\n\u00A0\t\nvier\n");
  const fs::path target = dir.write("tgt.txt", "one\n\nthree\nfour\n");
  CHECK_THROWS_WITH_AS(mf::text::read_parallel_corpus(source, target),
                       fmt::format("read_parallel_corpus: line 2 of target file '{}' is blank (set "
                                   "CorpusOptions::skip_empty to drop such pairs)",
                                   target.string())
                           .c_str(),
                       mf::Error);
  const mf::text::Corpus corpus = mf::text::read_parallel_corpus(source, target, {.skip_empty = true});
  CHECK(corpus.sources == std::vector<Tokens>{{"eins"}, {"vier"}});
  CHECK(corpus.targets == std::vector<Tokens>{{"one"}, {"four"}});
  CHECK(corpus.stats.pairs == 2);
  CHECK(corpus.stats.skipped_empty == 2);

  CHECK_THROWS_WITH_AS(mf::text::make_corpus({{"a", "b"}, {" ", "c"}}),
                       "make_corpus: pair 2 has a blank source sentence (set CorpusOptions::skip_empty to drop such "
                       "pairs)",
                       mf::Error);
  CHECK(mf::text::make_corpus({{"a", "b"}, {" ", "c"}}, {.skip_empty = true}).stats.skipped_empty == 1);
}

TEST_CASE("corpus names a missing or unreadable file") {
  TempDir dir;
  const fs::path source = dir.write("src.txt", "a\n");
  const fs::path missing = dir.path / "missing.txt";
  CHECK_THROWS_WITH_AS(
      mf::text::read_parallel_corpus(source, missing),
      fmt::format("read_parallel_corpus: target file '{}' does not exist", missing.string()).c_str(), mf::Error);
  CHECK_THROWS_WITH_AS(
      mf::text::read_parallel_corpus(dir.path, source),
      fmt::format("read_parallel_corpus: source file '{}' is a directory", dir.path.string()).c_str(), mf::Error);
}

namespace {

// Koehn, "Statistical Machine Translation" (2010), section 4.2: "das Haus" / "the house", "das Buch" /
// "the book", "ein Buch" / "a book", as ids: das 0, Haus 1, Buch 2, ein 3; the 0, house 1, book 2, a 3.
const std::vector<std::vector<int64_t>> kKoehnSources{{0, 1}, {0, 2}, {3, 2}};
const std::vector<std::vector<int64_t>> kKoehnTargets{{0, 1}, {0, 2}, {3, 2}};

double probability(const mf::text::Lexicon& lexicon, int64_t source, int64_t target) {
  for (const mf::text::LexicalEntry& entry : lexicon.translations(source))
    if (entry.target == target) return entry.probability;
  return 0;
}

}  // namespace

TEST_CASE("IBM Model 1 gives Koehn's worked example its probabilities, pass by pass") {
  const mf::text::LexiconOptions plain{.iterations = 1, .null_word = false, .min_probability = 1e-9};
  // Pass 1 from uniform t: each target unit is shared equally between its pair's two source units, so
  // t(the | das) = (1/2 + 1/2) / (1/2 * 4) = 0.5, t(house | das) = t(book | das) = 0.25, and so on.
  const mf::text::Lexicon one = mf::text::Lexicon::train(kKoehnSources, kKoehnTargets, plain);
  CHECK(probability(one, 0, 0) == doctest::Approx(0.5));
  CHECK(probability(one, 0, 1) == doctest::Approx(0.25));
  CHECK(probability(one, 0, 2) == doctest::Approx(0.25));
  CHECK(probability(one, 2, 2) == doctest::Approx(0.5));
  CHECK(probability(one, 1, 1) == doctest::Approx(0.5));
  CHECK(probability(one, 3, 3) == doctest::Approx(0.5));
  CHECK(probability(one, 0, 3) == 0);  // "das" never meets "a"
  // Pass 2, worked by hand (the book's table has the same figures to four places): das collects the 1/2 +
  // 2/3, house 1/3 and book 1/3 -> t(the | das) = 7/11 = 0.6364; haus collects the 1/2, house 2/3 ->
  // t(house | haus) = 4/7 = 0.5714; buch collects book 2/3 + 1/2 of 11/6 -> 7/11.
  mf::text::LexiconOptions two = plain;
  two.iterations = 2;
  const mf::text::Lexicon second = mf::text::Lexicon::train(kKoehnSources, kKoehnTargets, two);
  CHECK(probability(second, 0, 0) == doctest::Approx(7.0 / 11));
  CHECK(probability(second, 0, 1) == doctest::Approx(2.0 / 11));
  CHECK(probability(second, 1, 1) == doctest::Approx(4.0 / 7));
  CHECK(probability(second, 1, 0) == doctest::Approx(3.0 / 7));
  CHECK(probability(second, 2, 2) == doctest::Approx(7.0 / 11));
  CHECK(probability(second, 3, 3) == doctest::Approx(4.0 / 7));
  // Many passes: each German word's own translation takes almost all of its mass, first in its list.
  mf::text::LexiconOptions many = plain;
  many.iterations = 50;
  const mf::text::Lexicon converged = mf::text::Lexicon::train(kKoehnSources, kKoehnTargets, many);
  for (int64_t word = 0; word < 4; ++word) {
    CHECK(converged.translations(word).front().target == word);
    CHECK(converged.translations(word).front().probability > 0.9);
  }
  double total = 0;  // t(. | das) is a distribution over the targets
  for (const mf::text::LexicalEntry& entry : converged.translations(0)) total += entry.probability;
  CHECK(total == doctest::Approx(1.0));
}

TEST_CASE("each pass reports the corpus's likelihood, which plain EM never lowers") {
  std::vector<mf::text::LexiconPass> passes;
  mf::text::LexiconOptions options{.iterations = 2, .null_word = false};
  options.on_pass = [&](const mf::text::LexiconPass& pass) { passes.push_back(pass); };
  mf::text::Lexicon::train(kKoehnSources, kKoehnTargets, options);
  REQUIRE(passes.size() == 2);
  // Pass 1 from t uniform over the 4 target words: every word has probability 1/4, perplexity 4.
  CHECK(passes[0].pass == 1);
  CHECK(passes[0].perplexity() == doctest::Approx(4));
  // Pass 2 under pass 1's table (the test above): p(e | pair) = the mean of t(e | f) over the pair's two
  // words: the 1/2 and house 3/8 in pair 1, the 3/8 and book 3/8 in pair 2, a 3/8 and book 1/2 in pair 3.
  CHECK(passes[1].log_likelihood == doctest::Approx((2 * std::log(0.5) + 4 * std::log(0.375)) / 6));
  CHECK(passes[1].diagonal_tension == 0);

  // On a corpus with NULL, and with fast_align's prior and its tension re-estimated (a generalized EM:
  // Newton's step maximizes the same expected log-likelihood), the likelihood never falls.
  const std::vector<std::vector<int64_t>> sources{{0, 1, 4}, {0, 2}, {3, 2, 4}, {1, 3}, {2, 0, 1}};
  const std::vector<std::vector<int64_t>> targets{{0, 1, 9}, {0, 2, 9}, {3, 9, 2, 4}, {1, 3}, {2, 0, 1, 9}};
  for (const double tension : {0.0, 4.0}) {
    CAPTURE(tension);
    passes.clear();
    options = {.iterations = 8, .diagonal_tension = tension, .optimize_tension = tension > 0};
    options.on_pass = [&](const mf::text::LexiconPass& pass) { passes.push_back(pass); };
    mf::text::Lexicon::train(sources, targets, options);
    REQUIRE(passes.size() == 8);
    for (size_t k = 1; k < passes.size(); ++k) CHECK(passes[k].log_likelihood >= passes[k - 1].log_likelihood - 1e-12);
  }
}

TEST_CASE("IBM Model 1's NULL word takes the unit every pair holds") {
  // "." ends every target sentence (id 9) and no source unit holds it more than another: with the NULL
  // word it goes there, and each source word's best translation is its own word.
  const std::vector<std::vector<int64_t>> sources{{0, 1}, {0, 2}, {3, 2}, {1}};
  const std::vector<std::vector<int64_t>> targets{{0, 1, 9}, {0, 2, 9}, {3, 2, 9}, {1, 9}};
  const mf::text::Lexicon with_null = mf::text::Lexicon::train(sources, targets, {.iterations = 20});
  const mf::text::Lexicon without = mf::text::Lexicon::train(sources, targets, {.iterations = 20, .null_word = false});
  for (int64_t word : {0, 2, 3}) CHECK(with_null.translations(word).front().target == word);
  CHECK(probability(with_null, 0, 9) < probability(without, 0, 9));
}

TEST_CASE("fast_align's diagonal prior credits the source unit across from each target unit") {
  // One pair, "a b" -> "A B", no NULL, tension 4, one pass from uniform t (so the posterior is the
  // prior): target position 1 of 2 weighs source position 1 by exp(-4 |1/2 - 1/2|) = 1 and position 2
  // by exp(-4 |1/2 - 2/2|) = e^-2, and position 2 the other way round; so t(A | a) = t(B | b) =
  // 1 / (1 + e^-2) = 0.8808, where IBM Model 1 leaves both at 1/2 however long it runs.
  const std::vector<std::vector<int64_t>> one_pair{{0, 1}};
  const mf::text::LexiconOptions diagonal{.iterations = 1, .null_word = false, .diagonal_tension = 4,
                                          .min_probability = 1e-9};
  const mf::text::Lexicon first_pass = mf::text::Lexicon::train(one_pair, one_pair, diagonal);
  CHECK(probability(first_pass, 0, 0) == doctest::Approx(1 / (1 + std::exp(-2.0))));
  CHECK(probability(first_pass, 0, 1) == doctest::Approx(std::exp(-2.0) / (1 + std::exp(-2.0))));
  CHECK(probability(first_pass, 1, 1) == doctest::Approx(1 / (1 + std::exp(-2.0))));
  const mf::text::Lexicon model1 = mf::text::Lexicon::train(one_pair, one_pair, {.iterations = 10, .null_word = false});
  CHECK(probability(model1, 0, 0) == doctest::Approx(0.5));

  // Every ordered pair of five units, translated in the same order and reversed. IBM Model 1 ignores
  // order, so it learns the same table from both. A fixed tension helps the first and hurts the second;
  // re-estimated, it rises on the first (each unit's own translation gains more) and falls on the second
  // (it loses less).
  std::vector<std::vector<int64_t>> pairs, reversed;
  for (int64_t a = 0; a < 5; ++a)
    for (int64_t b = 0; b < 5; ++b)
      if (a != b) {
        pairs.push_back({a, b});
        reversed.push_back({b, a});
      }
  const mf::text::LexiconOptions plain{.iterations = 4, .null_word = false, .min_probability = 1e-9};
  mf::text::LexiconOptions fixed = plain, optimized = plain;
  fixed.diagonal_tension = optimized.diagonal_tension = 1;
  optimized.optimize_tension = true;
  const auto own = [&](const std::vector<std::vector<int64_t>>& targets, const mf::text::LexiconOptions& options) {
    return probability(mf::text::Lexicon::train(pairs, targets, options), 0, 0);
  };
  CHECK(own(reversed, plain) == doctest::Approx(own(pairs, plain)));
  CHECK(own(pairs, plain) < own(pairs, fixed));
  CHECK(own(pairs, fixed) < own(pairs, optimized));
  CHECK(own(reversed, fixed) < own(reversed, optimized));
  CHECK(own(reversed, optimized) < own(reversed, plain));
  // The tension each pass leaves: after pass 1 (its posterior is the prior) it stays; then it rises on
  // the ordered pairs and falls on the reversed ones.
  const auto tensions = [&](const std::vector<std::vector<int64_t>>& targets) {
    std::vector<double> after;
    mf::text::LexiconOptions options = optimized;
    options.on_pass = [&](const mf::text::LexiconPass& pass) { after.push_back(pass.diagonal_tension); };
    mf::text::Lexicon::train(pairs, targets, options);
    return after;
  };
  const std::vector<double> rising = tensions(pairs), falling = tensions(reversed);
  CHECK(rising[0] == doctest::Approx(1));
  CHECK(falling[0] == doctest::Approx(1));
  CHECK(rising[1] > 1);
  CHECK(falling[1] < 1);
}

TEST_CASE("variational Bayes gives Koehn's first pass the digamma function's values") {
  // Pass 1 counts for "das": the 1, house 1/2, book 1/2 (total 2, three entries). With alpha = 1,
  // t(e | das) = exp(psi(count + 1) - psi(2 + 3)), and psi at these points is known in closed form:
  // psi(5) = 1 + 1/2 + 1/3 + 1/4 - gamma, psi(2) = 1 - gamma, psi(3/2) = 2 - 2 ln 2 - gamma. So
  // t(the | das) = exp(1 - 25/12) = exp(-13/12) and t(house | das) = exp(2 - 2 ln 2 - 25/12) = exp(-1/12) / 4.
  const mf::text::Lexicon bayes = mf::text::Lexicon::train(
      kKoehnSources, kKoehnTargets,
      {.iterations = 1, .null_word = false, .dirichlet_alpha = 1, .min_probability = 1e-9});
  CHECK(probability(bayes, 0, 0) == doctest::Approx(std::exp(-13.0 / 12)).epsilon(1e-9));
  CHECK(probability(bayes, 0, 1) == doctest::Approx(std::exp(-1.0 / 12) / 4).epsilon(1e-9));
  CHECK(probability(bayes, 0, 2) == doctest::Approx(std::exp(-1.0 / 12) / 4).epsilon(1e-9));
  // A small alpha drives the counts well below one unit to nothing: on the corpus above, after a few
  // passes each source unit keeps fewer translations above min_probability than under plain EM.
  const std::vector<std::vector<int64_t>> sources{{0, 1, 4}, {0, 2, 4}, {3, 2, 5}, {3, 1, 5}};
  const std::vector<std::vector<int64_t>> targets{{0, 1, 4}, {0, 2, 4}, {3, 2, 5}, {3, 1, 5}};
  const mf::text::Lexicon sparse =
      mf::text::Lexicon::train(sources, targets, {.iterations = 5, .dirichlet_alpha = 0.01});
  const mf::text::Lexicon dense = mf::text::Lexicon::train(sources, targets, {.iterations = 5});
  for (int64_t unit = 0; unit < 6; ++unit) CHECK(sparse.translations(unit).size() <= dense.translations(unit).size());
  CHECK(sparse.translations(0).size() < dense.translations(0).size());
  // One pair of 800 units a side: pass 1 shares each target unit out 1/801 to each position, and with
  // alpha 1e-5 t = exp(psi(1/801 + 1e-5) - psi(total)), about exp(-794), is 0 in a double. Pass 2 then
  // has nothing to share out: an error that says so, rather than NaN tables.
  std::vector<std::vector<int64_t>> long_pair(1);
  for (int64_t unit = 0; unit < 800; ++unit) long_pair[0].push_back(unit);
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train(long_pair, long_pair, {.iterations = 2, .dirichlet_alpha = 1e-5}),
                       doctest::Contains("pass 2: every source unit's t of target unit 0 in pair 1 (800 source "
                                         "units) underflowed to 0; dirichlet_alpha 1e-05 is too small"),
                       mf::Error);
  CHECK_NOTHROW(mf::text::Lexicon::train(long_pair, long_pair, {.iterations = 2, .dirichlet_alpha = 0.01}));
}

TEST_CASE("a lexicon keeps each source unit's most probable translations, and its shortlists follow Marian") {
  const std::vector<std::vector<int64_t>> sources{{4, 5}, {4, 6}, {7, 6}};
  const std::vector<std::vector<int64_t>> targets{{10, 11}, {10, 12}, {13, 12}};
  const mf::text::Lexicon all = mf::text::Lexicon::train(sources, targets, {.iterations = 3, .null_word = false});
  const mf::text::Lexicon one = mf::text::Lexicon::train(sources, targets, {.iterations = 3, .null_word = false,
                                                                            .keep = 1});
  CHECK(all.translations(4).size() == 3);  // 10, 11, 12
  REQUIRE(one.translations(4).size() == 1);
  CHECK(one.translations(4).front() == all.translations(4).front());
  for (size_t k = 1; k < all.translations(4).size(); ++k)
    CHECK(all.translations(4)[k - 1].probability >= all.translations(4)[k].probability);
  CHECK(all.translations(0).empty());   // never in a source sentence
  CHECK(all.translations(99).empty());  // beyond every id seen
  CHECK(all.sources() == 4);
  const mf::text::Lexicon likely = mf::text::Lexicon::train(sources, targets, {.iterations = 3, .null_word = false,
                                                                               .min_probability = 0.3});
  for (const mf::text::LexicalEntry& entry : likely.translations(4)) CHECK(entry.probability >= 0.3);

  // The first 3 ids, then unit 7's best translation (13); with a shared vocabulary unit 7 itself too.
  const std::vector<std::vector<int64_t>> batch{{7}};
  CHECK(all.shortlist(batch, 3, 1, false) == std::vector<int64_t>{0, 1, 2, 13});
  CHECK(all.shortlist(batch, 3, 1, true) == std::vector<int64_t>{0, 1, 2, 7, 13});
  const std::vector<int64_t> both = all.shortlist(std::vector<std::vector<int64_t>>{{7}, {4, 7}}, 0, 2, false);
  // 7: 13, then 12; 4: 10, then 11 (12 third: 6 explains most of pair 2's 12); 12 listed once.
  CHECK(both == std::vector<int64_t>{10, 11, 12, 13});
  CHECK(all.shortlist(batch, 0, 0, false).empty());
  CHECK_THROWS_WITH_AS(all.shortlist(batch, -1, 1, false), doctest::Contains("first and best must be at least 0"),
                       mf::Error);

  // With the target vocabulary ranked (TextCodec::ids_by_frequency), `first` counts in that order.
  const mf::text::Lexicon ranked = mf::text::Lexicon::train(sources, targets, {.iterations = 3, .null_word = false},
                                                            {0, 1, 2, 3, 12, 10, 4, 5});
  CHECK(ranked.shortlist(batch, 5, 1, false) == std::vector<int64_t>{0, 1, 2, 3, 12, 13});
  CHECK(ranked.shortlist(batch, 6, 0, false) == std::vector<int64_t>{0, 1, 2, 3, 10, 12});
  CHECK(ranked.shortlist(batch, 100, 0, false) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 10, 12});  // all 8
}

TEST_CASE("a lexicon refuses bad training input") {
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train({{1}}, {{1}, {2}}),
                       doctest::Contains("1 source sentences but 2 target sentences"), mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train({{1}}, {{-2}}), doctest::Contains("pair 1 holds the negative id -2"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train({{1}}, {{1}}, {.iterations = 0}),
                       doctest::Contains("iterations must be at least 1"), mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train({{1}}, {{1}}, {.keep = 0}), doctest::Contains("keep must be"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train({{1}}, {{1}}, {.min_probability = 0}),
                       doctest::Contains("min_probability must be in (0, 1]"), mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train({{1}}, {{1}}, {.diagonal_tension = -1}),
                       doctest::Contains("diagonal_tension must be 0 or more, got -1"), mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train({{1}}, {{1}}, {.null_probability = 1}),
                       doctest::Contains("null_probability must be in [0, 1), got 1"), mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train({{1}}, {{1}}, {.dirichlet_alpha = -0.5}),
                       doctest::Contains("dirichlet_alpha must be 0 or more, got -0.5"), mf::Error);
  // The target ranking orders ids once each: shortlist()'s `first` would count a repeated id twice.
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train({{1}}, {{1}}, {}, {0, 2, 1, 2}),
                       doctest::Contains("the target ranking holds the id 2 more than once"), mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::train({{1}}, {{1}}, {}, {0, -3, 1}),
                       doctest::Contains("the target ranking holds the negative id -3"), mf::Error);
  // Pairs with an empty side teach nothing.
  CHECK(mf::text::Lexicon::train({{}, {5}}, {{6}, {}}).sources() == 0);
}

TEST_CASE("a lexicon round-trips through Marian's lex.s2t text, and names what is wrong in a file") {
  TempDir dir;
  const mf::text::TextCodec german(mf::text::Vocab::build({{"das", 2}, {"haus", 1}, {"buch", 2}, {"ein", 1}}), {});
  const mf::text::TextCodec english(mf::text::Vocab::build({{"the", 2}, {"house", 1}, {"book", 2}, {"a", 1}}), {});
  std::vector<std::vector<int64_t>> sources, targets;
  for (const char* line : {"das haus", "das buch", "ein buch"}) sources.push_back(german.encode(line));
  for (const char* line : {"the house", "the book", "a book"}) targets.push_back(english.encode(line));
  const mf::text::Lexicon lexicon =
      mf::text::Lexicon::train(sources, targets, {.iterations = 4}, english.ids_by_frequency());
  const fs::path path = dir.path / "lex.s2t";
  lexicon.save(path, german, english);
  std::ifstream file(path);
  std::string first_line;
  std::getline(file, first_line);
  CHECK(first_line.rfind("book buch ", 0) == 0);  // "target source probability"; buch (id 4) first
  CHECK(mf::text::Lexicon::load(path, german, english) == lexicon);

  auto load = [&](const std::string& text) {
    return mf::text::Lexicon::load(dir.write("bad.s2t", text), german, english);
  };
  CHECK_THROWS_WITH_AS(load("the das\n"), doctest::Contains("line 1: expected \"target source probability\""),
                       mf::Error);
  CHECK_THROWS_WITH_AS(load("the das 0.5\nthe das 0.5 extra\n"), doctest::Contains("line 2: expected"), mf::Error);
  CHECK_THROWS_WITH_AS(load("the das 1.5\n"), doctest::Contains("line 1: the probability '1.5' is not a number in"),
                       mf::Error);
  CHECK_THROWS_WITH_AS(load("the das x\n"), doctest::Contains("the probability 'x'"), mf::Error);
  CHECK_THROWS_WITH_AS(load("the katze 0.5\n"),
                       doctest::Contains("line 1: the source unit 'katze' is not in the model's words"), mf::Error);
  CHECK_THROWS_WITH_AS(load("cat das 0.5\n"), doctest::Contains("the target unit 'cat' is not in"), mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::Lexicon::load(dir.path / "missing.s2t", german, english),
                       doctest::Contains("does not exist"), mf::Error);
  CHECK(load("").sources() == 0);
}
