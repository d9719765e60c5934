#include "text/sacrebleu.h"

#include "core/error.h"
#include "text/utf8.h"

#include <algorithm>
#include <string>
#include <unordered_map>

namespace mf::text {
namespace {

using detail::append_utf8;
using detail::lowercase_code_point;
using detail::next_code_point;

constexpr int kChrfBeta = 2;

// The characters Python's str.isspace() accepts, on which str.split() and str.rstrip() cut: sacrebleu
// splits words and strips lines with them. Unlike the training tokenizer's spaces, U+001C..U+001F count
// and the invisible U+200B and U+FEFF do not.
bool is_python_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// `text` as code points, each ill-formed byte as U+FFFD, lowercased if asked.
std::u32string decode(std::string_view text, bool lowercase) {
  std::u32string code_points;
  code_points.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const char32_t cp = next_code_point(text, pos);
    code_points.push_back(lowercase ? lowercase_code_point(cp) : cp);
  }
  return code_points;
}

std::string encode(std::u32string_view code_points) {
  std::string text;
  text.reserve(code_points.size());
  for (char32_t cp : code_points) append_utf8(text, cp);
  return text;
}

// Python's str.split(): the runs of non-space characters.
std::vector<std::string> split_words(std::u32string_view text) {
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && !is_python_space(text[i])) continue;
    if (i > start) words.push_back(encode(text.substr(start, i - start)));
    start = i + 1;
  }
  return words;
}

// Python's str.replace: every non-overlapping occurrence, left to right.
void replace_all(std::u32string& text, std::u32string_view from, std::u32string_view to) {
  for (size_t pos = text.find(from); pos != std::u32string::npos; pos = text.find(from, pos + to.size()))
    text.replace(pos, from.size(), to);
}

bool is_digit(char32_t cp) { return cp >= '0' && cp <= '9'; }
bool is_period_or_comma(char32_t cp) { return cp == '.' || cp == ','; }

// The ASCII symbols 13a makes tokens of their own: every printable ASCII character except letters, digits,
// the apostrophe, comma, hyphen and period (the space is in sacrebleu's class too, harmlessly).
bool is_13a_symbol(char32_t cp) {
  return (cp >= ' ' && cp <= '&') || (cp >= '(' && cp <= '+') || cp == '/' || (cp >= ':' && cp <= '@') ||
         (cp >= '[' && cp <= '`') || (cp >= '{' && cp <= '~');
}

// 13a's words of an already decoded (and possibly lowercased) line. Each step rewrites the whole line as
// sacrebleu's regular expression substitutions do, one after the other, so that a later rule sees the
// spaces an earlier one inserted.
std::vector<std::string> words_13a(std::u32string line) {
  replace_all(line, U"<skipped>", U"");
  replace_all(line, U"-\n", U"");
  replace_all(line, U"\n", U" ");
  replace_all(line, U"&quot;", U"\"");
  replace_all(line, U"&amp;", U"&");
  replace_all(line, U"&lt;", U"<");
  replace_all(line, U"&gt;", U">");

  // The line is padded with a space at each end first, so that a period or comma that begins or ends it
  // is split off too.
  std::u32string spaced = U" ";
  for (char32_t cp : line) {
    if (is_13a_symbol(cp)) {
      spaced += U' ';
      spaced += cp;
      spaced += U' ';
    } else {
      spaced += cp;
    }
  }
  spaced += U' ';
  // The three pattern rules match two characters each; a match consumes both, so the next match starts
  // after them (",," splits only its first comma off what precedes it, as in Python's re.sub).
  auto rewrite_pairs = [](const std::u32string& text, auto matches, auto emit) {
    std::u32string out;
    for (size_t i = 0; i < text.size();) {
      if (i + 1 < text.size() && matches(text[i], text[i + 1])) {
        emit(out, text[i], text[i + 1]);
        i += 2;
      } else {
        out += text[i++];
      }
    }
    return out;
  };
  // A period or comma after a non-digit: "x." -> "x . ".
  spaced = rewrite_pairs(
      spaced, [](char32_t a, char32_t b) { return !is_digit(a) && is_period_or_comma(b); },
      [](std::u32string& out, char32_t a, char32_t b) { out.append({a, U' ', b, U' '}); });
  // A period or comma before a non-digit: ".x" -> " . x".
  spaced = rewrite_pairs(
      spaced, [](char32_t a, char32_t b) { return is_period_or_comma(a) && !is_digit(b); },
      [](std::u32string& out, char32_t a, char32_t b) { out.append({U' ', a, U' ', b}); });
  // A hyphen after a digit: "1-" -> "1 - ".
  spaced = rewrite_pairs(
      spaced, [](char32_t a, char32_t b) { return is_digit(a) && b == '-'; },
      [](std::u32string& out, char32_t a, char32_t b) { out.append({a, U' ', b, U' '}); });
  return split_words(spaced);
}

std::string join(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) {
    if (!text.empty()) text += ' ';
    text += word;
  }
  return text;
}

std::string rules_version() { return fmt::format("{}-miniflow", kSacrebleuRulesVersion); }

}  // namespace

std::string tokenize_13a(std::string_view line) { return join(words_13a(decode(line, false))); }

std::vector<std::string> sacrebleu_words(std::string_view line, const SacreBleuOptions& options) {
  std::u32string text = decode(line, options.lowercase);
  // sacrebleu strips the line's end before tokenizing; that only shows when a hyphen and a newline end it.
  while (!text.empty() && is_python_space(text.back())) text.pop_back();
  return options.tokenization == BleuTokenization::Mteval13a ? words_13a(std::move(text)) : split_words(text);
}

std::string sacrebleu_signature(const SacreBleuOptions& options) {
  return fmt::format("nrefs:1|case:{}|eff:no|tok:{}|smooth:{}|version:{}", options.lowercase ? "lc" : "mixed",
                     options.tokenization == BleuTokenization::Mteval13a ? "13a" : "none",
                     smoothing_name(options.smoothing), rules_version());
}

BleuScore corpus_sacrebleu(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references,
                           const SacreBleuOptions& options) {
  MF_CHECK(hypotheses.size() == references.size(),
           "corpus_sacrebleu: {} hypotheses but {} references (one reference per hypothesis)", hypotheses.size(),
           references.size());
  std::vector<std::vector<std::string>> hypothesis_words, reference_words;
  hypothesis_words.reserve(hypotheses.size());
  reference_words.reserve(references.size());
  for (const std::string& line : hypotheses) hypothesis_words.push_back(sacrebleu_words(line, options));
  for (const std::string& line : references) reference_words.push_back(sacrebleu_words(line, options));
  BleuScore result = corpus_bleu(hypothesis_words, reference_words, options.smoothing);
  result.signature = sacrebleu_signature(options);
  return result;
}

BleuScore sacrebleu_from_counts(const BleuScore& counts, const SacreBleuOptions& options) {
  BleuScore result = bleu_from_counts(counts, options.smoothing);
  result.signature = sacrebleu_signature(options);
  return result;
}

std::string ChrfScore::str() const {
  return fmt::format("chrF{}{}{} = {:.2f}", kChrfBeta, signature.empty() ? "" : "|", signature, score);
}

ChrfScore corpus_chrf(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references,
                      const ChrfOptions& options) {
  MF_CHECK(hypotheses.size() == references.size(),
           "corpus_chrf: {} hypotheses but {} references (one reference per hypothesis)", hypotheses.size(),
           references.size());
  auto without_spaces = [&](std::string_view line) {
    std::u32string text = decode(line, options.lowercase);
    std::erase_if(text, is_python_space);
    return text;
  };
  using CharNGramCounts = std::unordered_map<std::u32string_view, int64_t>;
  auto count_ngrams = [](std::u32string_view text, size_t n) {
    CharNGramCounts counts;
    for (size_t start = 0; start + n <= text.size(); ++start) ++counts[text.substr(start, n)];
    return counts;
  };
  ChrfScore result;
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    const std::u32string hypothesis = without_spaces(hypotheses[i]);
    const std::u32string reference = without_spaces(references[i]);
    for (size_t n = 1; n <= kChrfCharOrder; ++n) {
      ChrfOrderCounts& order = result.counts[n - 1];
      if (reference.size() < n) continue;  // sacrebleu counts no hypothesis n-grams against an empty reference
      const CharNGramCounts reference_counts = count_ngrams(reference, n);
      for (const auto& [ngram, count] : count_ngrams(hypothesis, n)) {
        order.hypothesis += count;
        auto it = reference_counts.find(ngram);
        if (it != reference_counts.end()) order.matches += std::min(count, it->second);
      }
      order.reference += static_cast<int64_t>(reference.size() - n + 1);
    }
  }
  return chrf_from_counts(result, options);
}

ChrfScore chrf_from_counts(const ChrfScore& counts, const ChrfOptions& options) {
  ChrfScore result;
  result.counts = counts.counts;
  result.signature = fmt::format("nrefs:1|case:{}|eff:yes|nc:{}|nw:0|space:no|version:{}",
                                 options.lowercase ? "lc" : "mixed", kChrfCharOrder, rules_version());
  // Precision and recall are averaged over the orders both sides have n-grams of ("eff:yes"), then combined.
  double precision = 0, recall = 0;
  int effective_orders = 0;
  for (const ChrfOrderCounts& order : result.counts) {
    if (order.hypothesis == 0 || order.reference == 0) continue;
    precision += static_cast<double>(order.matches) / static_cast<double>(order.hypothesis);
    recall += static_cast<double>(order.matches) / static_cast<double>(order.reference);
    ++effective_orders;
  }
  if (effective_orders == 0 || precision + recall == 0) return result;
  precision /= effective_orders;
  recall /= effective_orders;
  constexpr double beta_squared = kChrfBeta * kChrfBeta;
  result.score = 100 * (1 + beta_squared) * precision * recall / (beta_squared * precision + recall);
  return result;
}

}  // namespace mf::text
