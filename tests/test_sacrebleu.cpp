// sacreBLEU's BLEU and chrF (text/sacrebleu.h). Every expected value here is worked out by hand from
// sacrebleu 2.4.3's rules (the 13a tokenizer's replacements and patterns, the exp smoothing, chrF's
// averaged F-beta); tests/interop_sacrebleu.py holds the same scorers against Python's sacrebleu itself.
#include <doctest/doctest.h>

#include "miniflow.h"

#include <cmath>
#include <string>
#include <vector>

namespace {

using mf::text::BleuSmoothing;
using mf::text::BleuTokenization;
using mf::text::ChrfOrderCounts;
using mf::text::tokenize_13a;

}  // namespace

TEST_CASE("13a splits ASCII symbols off, and periods and commas unless a digit is on that side") {
  CHECK(tokenize_13a("Hello, world!") == "Hello , world !");
  // "$" is a symbol; "3.50" and "1,000" have digits on both sides; ", " and "n." split; the final "."
  // is followed by the padding space.
  CHECK(tokenize_13a("It costs $3.50, or 1,000 yen.") == "It costs $ 3.50 , or 1,000 yen .");
  // A comma opening the line is split from the digit after it because the line's start counts as a space.
  CHECK(tokenize_13a(",5 and 10.") == ", 5 and 10 .");
  // Each "x." match consumes the period, so every period of an abbreviation splits.
  CHECK(tokenize_13a("U.S.A.") == "U . S . A .");
  // A hyphen splits only after a digit; apostrophes never split.
  CHECK(tokenize_13a("well-known 1-2 e-mail don't") == "well-known 1 - 2 e-mail don't");
  CHECK(tokenize_13a("a(b)[c]{d}<e>f/g:h;i=j?k@l#m%n^o_p`q|r~s\\t+u*v") ==
        "a ( b ) [ c ] { d } < e > f / g : h ; i = j ? k @ l # m % n ^ o _ p ` q | r ~ s \\ t + u * v");
}

TEST_CASE("13a's replacements: <skipped>, line-end hyphens, newlines and four entities, in order") {
  CHECK(tokenize_13a("<skipped>word") == "word");
  CHECK(tokenize_13a("hyphen-\nated") == "hyphenated");
  CHECK(tokenize_13a("two\nlines") == "two lines");
  CHECK(tokenize_13a("&quot;Hi&quot; &amp; &lt;b&gt;") == "\" Hi \" & < b >");
  // &amp; is replaced before &lt;, so the "&lt;" it leaves becomes "<" too.
  CHECK(tokenize_13a("&amp;lt;") == "<");
  // Other entities are not decoded: "&", "#" and ";" are symbols.
  CHECK(tokenize_13a("&#39;") == "& # 39 ;");
}

TEST_CASE("13a splits on Python's whitespace and leaves other Unicode alone") {
  CHECK(tokenize_13a("a\u00A0b\tc\u2009d  e") == "a b c d e");  // no-break, tab, thin space
  CHECK(tokenize_13a("zero\u200Bwidth") == "zero\u200Bwidth");  // U+200B is no space to Python
  CHECK(tokenize_13a("Ärger… über „so“") == "Ärger… über „so“");  // non-ASCII punctuation stays attached
  CHECK(tokenize_13a("bad\xFF byte") == "bad\uFFFD byte");
  CHECK(tokenize_13a("") == "");
}

TEST_CASE("sacrebleu_words lowercases before tokenizing and strips the line's end first") {
  using Words = std::vector<std::string>;
  // Lowercased, "&QUOT;" becomes the entity &quot;; cased, "&" and ";" are symbols.
  CHECK(mf::text::sacrebleu_words("&QUOT;Hi&QUOT;", {.lowercase = true}) == Words{"\"", "hi", "\""});
  CHECK(mf::text::sacrebleu_words("&QUOT;Hi&QUOT;") == Words{"&", "QUOT", ";", "Hi", "&", "QUOT", ";"});
  CHECK(mf::text::sacrebleu_words("ÄRGER Über", {.lowercase = true}) == Words{"ärger", "über"});
  // Stripped first, the trailing newline no longer joins "a-" to anything.
  CHECK(mf::text::sacrebleu_words("a-\n") == Words{"a-"});
  CHECK(tokenize_13a("a-\n") == "a");
  CHECK(mf::text::sacrebleu_words("x, y.", {.tokenization = BleuTokenization::None}) == Words{"x,", "y."});
}

TEST_CASE("corpus_sacrebleu is cased by default and counts 13a tokens") {
  // Tokens: "the cat sat on a mat ." against "The cat sat on a mat ."; cased, only "the" differs, which
  // also breaks the first bigram, trigram and 4-gram: 6/7, 5/6, 4/5, 3/4; equal lengths, BP = 1.
  const std::vector<std::string> hyp{"the cat sat on a mat."}, ref{"The cat sat on a mat."};
  const mf::text::BleuScore cased = mf::text::corpus_sacrebleu(hyp, ref);
  CHECK(cased.matches == std::array<int64_t, 4>{6, 5, 4, 3});
  CHECK(cased.totals == std::array<int64_t, 4>{7, 6, 5, 4});
  CHECK(cased.hypothesis_length == 7);
  CHECK(cased.reference_length == 7);
  CHECK(cased.score == doctest::Approx(100.0 * std::pow(6.0 / 7 * 5.0 / 6 * 4.0 / 5 * 3.0 / 4, 0.25)));
  CHECK(cased.signature == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3-miniflow");
  CHECK(cased.str() ==
        "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3-miniflow = 80.91 "
        "85.7/83.3/80.0/75.0 (BP = 1.000 ratio = 1.000 hyp_len = 7 ref_len = 7)");

  const mf::text::BleuScore lowercased = mf::text::corpus_sacrebleu(hyp, ref, {.lowercase = true});
  CHECK(lowercased.score == doctest::Approx(100.0));
  CHECK(lowercased.signature == "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.4.3-miniflow");
}

TEST_CASE("exp smoothing halves the stand-in precision for each further order without a match") {
  // "x y z w" against "x y w z": unigrams 4/4, bigrams 1/3 (x y), trigrams 0/2, 4-grams 0/1. Exp gives
  // the first empty order 1/(2 * 2) and the second 1/(4 * 1).
  const std::vector<std::string> hyp{"x y z w"}, ref{"x y w z"};
  const mf::text::BleuScore exp = mf::text::corpus_sacrebleu(hyp, ref);
  CHECK(exp.precisions[0] == doctest::Approx(100.0));
  CHECK(exp.precisions[1] == doctest::Approx(100.0 / 3));
  CHECK(exp.precisions[2] == doctest::Approx(25.0));
  CHECK(exp.precisions[3] == doctest::Approx(25.0));
  CHECK(exp.score == doctest::Approx(100.0 * std::pow(1.0 / 3 / 4 / 4, 0.25)));

  CHECK(mf::text::corpus_sacrebleu(hyp, ref, {.smoothing = BleuSmoothing::None}).score == 0.0);
  // Add-one: (1+1)/(3+1), (0+1)/(2+1), (0+1)/(1+1).
  const mf::text::BleuScore add_one = mf::text::corpus_sacrebleu(hyp, ref, {.smoothing = BleuSmoothing::AddOne});
  CHECK(add_one.score == doctest::Approx(100.0 * std::pow(0.5 / 3 * 0.5, 0.25)));
  CHECK(add_one.signature == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:add-k[1.00]|version:2.4.3-miniflow");

  // Without any match, sacrebleu stops before smoothing: 0.
  CHECK(mf::text::corpus_sacrebleu({"a b"}, {"c d"}).score == 0.0);
}

TEST_CASE("chrF: character n-gram precision and recall averaged over orders, whitespace ignored") {
  // "ab" against "abc": order 1 P 2/2 R 2/3, order 2 P 1/1 R 1/2; order 3 has a reference trigram but no
  // hypothesis one (no effective order); the reference has no n-grams of orders 4..6. Averaged P = 1,
  // R = 7/12, and F2 = 5PR / (4P + R) = 7/11.
  const mf::text::ChrfScore chrf = mf::text::corpus_chrf({"a b"}, {"abc"});
  CHECK(chrf.counts[0] == ChrfOrderCounts{.hypothesis = 2, .reference = 3, .matches = 2});
  CHECK(chrf.counts[1] == ChrfOrderCounts{.hypothesis = 1, .reference = 2, .matches = 1});
  CHECK(chrf.counts[2] == ChrfOrderCounts{.hypothesis = 0, .reference = 1, .matches = 0});
  CHECK(chrf.counts[3] == ChrfOrderCounts{});
  CHECK(chrf.score == doctest::Approx(100.0 * 7 / 11));
  CHECK(chrf.str() == "chrF2|nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.4.3-miniflow = 63.64");

  // A reference without bigrams makes sacrebleu count none of the hypothesis's: only order 1 is
  // effective, P = 1/3, R = 1, F2 = (5/3) / (7/3) = 5/7.
  const mf::text::ChrfScore short_reference = mf::text::corpus_chrf({"abc"}, {"a"});
  CHECK(short_reference.counts[1] == ChrfOrderCounts{});
  CHECK(short_reference.score == doctest::Approx(100.0 * 5 / 7));

  // Code points, not bytes: "ä" is one character.
  CHECK(mf::text::corpus_chrf({"ä"}, {"ä"}).counts[1] == ChrfOrderCounts{});
  CHECK(mf::text::corpus_chrf({"ä"}, {"ä"}).score == doctest::Approx(100.0));
}

TEST_CASE("chrF is cased by default; lowercase=true ignores case") {
  CHECK(mf::text::corpus_chrf({"AB"}, {"abc"}).score == 0.0);
  const mf::text::ChrfScore lowercased = mf::text::corpus_chrf({"AB"}, {"abc"}, {.lowercase = true});
  CHECK(lowercased.score == doctest::Approx(100.0 * 7 / 11));
  CHECK(lowercased.signature == "nrefs:1|case:lc|eff:yes|nc:6|nw:0|space:no|version:2.4.3-miniflow");
}

TEST_CASE("BLEU and chrF of shards' summed counts equal those of the whole corpus") {
  const std::vector<std::string> hyps{"The cat sat on the mat.", "It costs 3.50, not 1,000!", "", "A dog, running."};
  const std::vector<std::string> refs{"The cat sat on a mat.", "It costs 3.50 and not 1,000.", "Empty.",
                                      "A dog is running."};
  const std::vector<std::string> first_hyps(hyps.begin(), hyps.begin() + 2), second_hyps(hyps.begin() + 2, hyps.end());
  const std::vector<std::string> first_refs(refs.begin(), refs.begin() + 2), second_refs(refs.begin() + 2, refs.end());

  const mf::text::BleuScore whole = mf::text::corpus_sacrebleu(hyps, refs);
  const mf::text::BleuScore first = mf::text::corpus_sacrebleu(first_hyps, first_refs);
  const mf::text::BleuScore second = mf::text::corpus_sacrebleu(second_hyps, second_refs);
  mf::text::BleuScore summed;
  summed.hypothesis_length = first.hypothesis_length + second.hypothesis_length;
  summed.reference_length = first.reference_length + second.reference_length;
  for (size_t n = 0; n < 4; ++n) {
    summed.matches[n] = first.matches[n] + second.matches[n];
    summed.totals[n] = first.totals[n] + second.totals[n];
  }
  const mf::text::BleuScore from_counts = mf::text::sacrebleu_from_counts(summed);
  CHECK(from_counts.score == whole.score);
  CHECK(from_counts.str() == whole.str());

  const mf::text::ChrfScore whole_chrf = mf::text::corpus_chrf(hyps, refs);
  const mf::text::ChrfScore first_chrf = mf::text::corpus_chrf(first_hyps, first_refs);
  const mf::text::ChrfScore second_chrf = mf::text::corpus_chrf(second_hyps, second_refs);
  mf::text::ChrfScore summed_chrf;
  for (size_t n = 0; n < summed_chrf.counts.size(); ++n) {
    summed_chrf.counts[n] = {first_chrf.counts[n].hypothesis + second_chrf.counts[n].hypothesis,
                             first_chrf.counts[n].reference + second_chrf.counts[n].reference,
                             first_chrf.counts[n].matches + second_chrf.counts[n].matches};
  }
  CHECK(mf::text::chrf_from_counts(summed_chrf).score == whole_chrf.score);
  CHECK(mf::text::chrf_from_counts(summed_chrf).str() == whole_chrf.str());
}

TEST_CASE("the scorers reject corpora of different lengths") {
  CHECK_THROWS_WITH_AS(mf::text::corpus_sacrebleu({"a", "b"}, {"a"}),
                       "corpus_sacrebleu: 2 hypotheses but 1 references (one reference per hypothesis)", mf::Error);
  CHECK_THROWS_WITH_AS(mf::text::corpus_chrf({"a"}, {}),
                       "corpus_chrf: 1 hypotheses but 0 references (one reference per hypothesis)", mf::Error);
}
