#include "text/lexicon.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "text/files.h"
#include "text/special_tokens.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

namespace mf::text {

namespace {

/// The (source, target) pairs a corpus makes co-occur, as compressed rows by source: row f holds the
/// targets that share a sentence pair with f, ascending. Row `null_row` (one past the vocabulary) holds
/// every target, for the NULL word.
struct CoOccurrences {
  std::vector<int64_t> row_start;  // [rows + 1]
  std::vector<int64_t> targets;

  int64_t slot(int64_t source, int64_t target) const {
    const auto first = targets.begin() + row_start[static_cast<size_t>(source)];
    const auto last = targets.begin() + row_start[static_cast<size_t>(source) + 1];
    return std::lower_bound(first, last, target) - targets.begin();
  }
};

CoOccurrences co_occurrences(const std::vector<std::vector<int64_t>>& sources,
                             const std::vector<std::vector<int64_t>>& targets, int64_t source_rows, bool null_word) {
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(source_rows) + 1);
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].empty() || targets[i].empty()) continue;
    for (int64_t f : sources[i]) rows[static_cast<size_t>(f)].insert(rows[static_cast<size_t>(f)].end(),
                                                                      targets[i].begin(), targets[i].end());
    if (null_word) rows.back().insert(rows.back().end(), targets[i].begin(), targets[i].end());
  }
  CoOccurrences out;
  out.row_start.push_back(0);
  for (std::vector<int64_t>& row : rows) {
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    out.targets.insert(out.targets.end(), row.begin(), row.end());
    out.row_start.push_back(static_cast<int64_t>(out.targets.size()));
    std::vector<int64_t>().swap(row);
  }
  return out;
}

/// psi(x), the digamma function, for x > 0: the recurrence psi(x) = psi(x + 1) - 1/x up to x >= 6,
/// then the asymptotic series ln x - 1/(2x) - sum B_2k / (2k x^2k) (Abramowitz and Stegun 6.3.18),
/// whose first omitted term is below 1e-11 there.
double digamma(double x) {
  double shift = 0;
  for (; x < 6; x += 1) shift -= 1 / x;
  const double r = 1 / (x * x);
  return shift + std::log(x) - 0.5 / x - r * (1.0 / 12 - r * (1.0 / 120 - r * (1.0 / 252 - r * (1.0 / 240 - r / 132))));
}

/// fast_align's alignment feature: minus the distance from the diagonal of source position j (of n)
/// for target position i (of m), both counted from 1.
double diagonal_feature(int64_t i, int64_t m, int64_t j, int64_t n) {
  return -std::abs(static_cast<double>(i) / static_cast<double>(m) - static_cast<double>(j) / static_cast<double>(n));
}

/// The mean and variance of diagonal_feature over source positions j = 1..n weighted by
/// exp(tension * feature): what the alignment prior expects at target position i of m.
std::pair<double, double> diagonal_moments(int64_t i, int64_t m, int64_t n, double tension) {
  double z = 0, first = 0, second = 0;
  for (int64_t j = 1; j <= n; ++j) {
    const double h = diagonal_feature(i, m, j, n), w = std::exp(tension * h);
    z += w;
    first += w * h;
    second += w * h * h;
  }
  const double mean = first / z;
  return {mean, std::max(0.0, second / z - mean * mean)};
}

/// What a pass's alignments say of the tension: the expected feature summed over every target unit's
/// posterior (NULL aside), and per (target length, source length) and target position the posterior
/// mass off NULL, which the prior's expectation is weighed by.
struct TensionEvidence {
  double feature = 0;
  std::map<std::pair<int64_t, int64_t>, std::vector<double>> aligned_mass;
};

/// The tension maximizing the pass's expected log-likelihood of its alignments, sum over units of
/// tension * feature - log Z(tension) weighed by the aligned mass: concave in the tension, so Newton's
/// method from `tension`, kept within [0, kMaxTension].
double optimized_tension(const TensionEvidence& evidence, double tension) {
  constexpr double kMaxTension = 100;  // exp(-100) already leaves the far positions nothing
  for (int step = 0; step < 50; ++step) {
    double gradient = evidence.feature, curvature = 0;
    for (const auto& [lengths, masses] : evidence.aligned_mass)
      for (size_t i = 0; i < masses.size(); ++i) {
        const auto [mean, variance] = diagonal_moments(static_cast<int64_t>(i) + 1, lengths.first, lengths.second,
                                                       tension);
        gradient -= masses[i] * mean;
        curvature += masses[i] * variance;
      }
    if (curvature <= 0) break;  // every sentence one source unit long: the tension changes nothing
    const double next = std::clamp(tension + gradient / curvature, 0.0, kMaxTension);
    const bool settled = std::abs(next - tension) < 1e-9 * std::max(1.0, tension);
    tension = next;
    if (settled) break;
  }
  return tension;
}

bool holds_space(const std::string& unit) {
  return std::any_of(unit.begin(), unit.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

/// Each unit of `codec` by its text, for load().
std::unordered_map<std::string, int64_t> ids_by_unit(const TextCodec& codec) {
  std::unordered_map<std::string, int64_t> ids;
  for (int64_t id = 0; id < codec.size(); ++id) ids.emplace(codec.unit(id), id);
  return ids;
}

}  // namespace

Lexicon Lexicon::train(const std::vector<std::vector<int64_t>>& sources,
                       const std::vector<std::vector<int64_t>>& targets, const LexiconOptions& options,
                       std::vector<int64_t> targets_by_frequency) {
  MF_CHECK(options.iterations >= 1, "Lexicon::train: iterations must be at least 1, got {}", options.iterations);
  MF_CHECK(options.keep >= 1, "Lexicon::train: keep must be at least 1, got {}", options.keep);
  MF_CHECK(options.min_probability > 0 && options.min_probability <= 1,
           "Lexicon::train: min_probability must be in (0, 1], got {}", options.min_probability);
  MF_CHECK(options.diagonal_tension >= 0 && std::isfinite(options.diagonal_tension),
           "Lexicon::train: diagonal_tension must be 0 or more, got {}", options.diagonal_tension);
  MF_CHECK(options.null_probability >= 0 && options.null_probability < 1,
           "Lexicon::train: null_probability must be in [0, 1), got {}", options.null_probability);
  MF_CHECK(options.dirichlet_alpha >= 0 && std::isfinite(options.dirichlet_alpha),
           "Lexicon::train: dirichlet_alpha must be 0 or more, got {}", options.dirichlet_alpha);
  MF_CHECK(sources.size() == targets.size(), "Lexicon::train: {} source sentences but {} target sentences",
           sources.size(), targets.size());
  std::vector<int64_t> ranked(targets_by_frequency);
  std::sort(ranked.begin(), ranked.end());
  MF_CHECK(ranked.empty() || ranked.front() >= 0, "Lexicon::train: the target ranking holds the negative id {}",
           ranked.empty() ? 0 : ranked.front());
  const auto repeated = std::adjacent_find(ranked.begin(), ranked.end());
  MF_CHECK(repeated == ranked.end(), "Lexicon::train: the target ranking holds the id {} more than once",
           repeated == ranked.end() ? 0 : *repeated);
  int64_t source_rows = 0;        // one past the largest source id
  std::vector<bool> target_held;  // by target id: whether the corpus holds it
  for (size_t i = 0; i < sources.size(); ++i) {
    for (int64_t id : targets[i]) {
      MF_CHECK(id >= 0, "Lexicon::train: pair {} holds the negative id {}", i + 1, id);
      if (sources[i].empty()) continue;  // a pair with an empty side teaches nothing
      if (static_cast<size_t>(id) >= target_held.size()) target_held.resize(static_cast<size_t>(id) + 1);
      target_held[static_cast<size_t>(id)] = true;
    }
    for (int64_t id : sources[i]) {
      MF_CHECK(id >= 0, "Lexicon::train: pair {} holds the negative id {}", i + 1, id);
      source_rows = std::max(source_rows, id + 1);
    }
  }
  const CoOccurrences pairs = co_occurrences(sources, targets, source_rows, options.null_word);
  const int64_t null_row = source_rows;
  const bool diagonal = options.diagonal_tension > 0;
  const double null_prior = options.null_word ? options.null_probability : 0.0;

  // EM (Koehn, "Statistical Machine Translation", fig. 4.3): each target unit e of a pair is shared out
  // over the pair's source units f (and NULL) in proportion to prior(position of f) * t(e | f); t(e | f)
  // becomes f's share of e over f's shares of all units. IBM Model 1's prior is uniform; fast_align's
  // favours the diagonal and gives NULL null_probability. Uniform t over the corpus's target units to
  // start.
  const auto distinct_targets = std::count(target_held.begin(), target_held.end(), true);
  std::vector<double> t(pairs.targets.size(), 1.0 / static_cast<double>(std::max<int64_t>(1, distinct_targets)));
  std::vector<double> counts(pairs.targets.size());
  std::vector<int64_t> slots;
  std::vector<double> weights, features;  // features: diagonal_feature of each source position
  double tension = options.diagonal_tension;
  for (int64_t iteration = 0; iteration < options.iterations; ++iteration) {
    std::fill(counts.begin(), counts.end(), 0.0);
    TensionEvidence evidence;
    double log_likelihood = 0;
    int64_t target_units_seen = 0;
    for (size_t i = 0; i < sources.size(); ++i) {
      if (sources[i].empty() || targets[i].empty()) continue;
      const auto m = static_cast<int64_t>(targets[i].size()), n = static_cast<int64_t>(sources[i].size());
      std::vector<double>* aligned_mass = nullptr;
      if (diagonal && options.optimize_tension) {
        aligned_mass = &evidence.aligned_mass[{m, n}];
        aligned_mass->resize(static_cast<size_t>(m));
      }
      for (int64_t position = 0; position < m; ++position) {
        const int64_t e = targets[i][static_cast<size_t>(position)];
        slots.clear();
        weights.clear();
        for (int64_t f : sources[i]) slots.push_back(pairs.slot(f, e));
        if (diagonal) {
          features.clear();
          double z = 0;
          for (int64_t j = 1; j <= n; ++j) {
            const double h = features.emplace_back(diagonal_feature(position + 1, m, j, n));
            z += weights.emplace_back(std::exp(tension * h));
          }
          for (double& w : weights) w *= (1 - null_prior) / z;
        } else {
          weights.assign(slots.size(), 1.0);
        }
        if (options.null_word) {
          slots.push_back(pairs.slot(null_row, e));
          weights.push_back(diagonal ? null_prior : 1.0);
        }
        double sum = 0;
        for (size_t k = 0; k < slots.size(); ++k) sum += weights[k] *= t[static_cast<size_t>(slots[k])];
        // Variational Bayes takes a count c far below alpha to about exp(-1 / (c + alpha)), which is 0 in
        // a double below about 1/745: a long sentence's shares of one unit can all get there.
        MF_CHECK(sum > 0,
                 "Lexicon::train: pass {}: every source unit's t of target unit {} in pair {} ({} source units) "
                 "underflowed to 0; dirichlet_alpha {} is too small for sentences this long",
                 iteration + 1, e, i + 1, n, options.dirichlet_alpha);
        for (size_t k = 0; k < slots.size(); ++k) counts[static_cast<size_t>(slots[k])] += weights[k] / sum;
        // IBM Model 1's weights are 1 for each of its n (+ NULL) positions: its prior is 1 / their count.
        log_likelihood += std::log(diagonal ? sum : sum / static_cast<double>(slots.size()));
        ++target_units_seen;
        if (aligned_mass) {
          for (size_t j = 0; j < features.size(); ++j) {
            const double posterior = weights[j] / sum;
            evidence.feature += posterior * features[j];
            (*aligned_mass)[static_cast<size_t>(position)] += posterior;
          }
        }
      }
    }
    const double alpha = options.dirichlet_alpha;
    for (int64_t f = 0; f <= null_row; ++f) {
      const auto first = static_cast<size_t>(pairs.row_start[static_cast<size_t>(f)]);
      const auto last = static_cast<size_t>(pairs.row_start[static_cast<size_t>(f) + 1]);
      const double total = std::accumulate(counts.begin() + static_cast<ptrdiff_t>(first),
                                           counts.begin() + static_cast<ptrdiff_t>(last), 0.0);
      if (alpha == 0) {
        for (size_t s = first; s < last; ++s) t[s] = counts[s] / total;
        continue;
      }
      // Variational Bayes (fast_align's -v): t = exp(psi(count + alpha) - psi(total + alpha * entries)).
      const double psi_total = digamma(total + alpha * static_cast<double>(last - first));
      for (size_t s = first; s < last; ++s) t[s] = std::exp(digamma(counts[s] + alpha) - psi_total);
    }
    if (diagonal && options.optimize_tension) tension = optimized_tension(evidence, tension);
    if (options.on_pass) {
      const double mean = target_units_seen ? log_likelihood / static_cast<double>(target_units_seen) : 0.0;
      options.on_pass({.pass = iteration + 1, .log_likelihood = mean, .diagonal_tension = tension});
    }
  }

  Lexicon lexicon;
  lexicon.targets_by_frequency_ = std::move(targets_by_frequency);
  lexicon.translations_.resize(static_cast<size_t>(source_rows));
  for (int64_t f = 0; f < source_rows; ++f) {
    std::vector<LexicalEntry>& entries = lexicon.translations_[static_cast<size_t>(f)];
    for (int64_t s = pairs.row_start[static_cast<size_t>(f)]; s < pairs.row_start[static_cast<size_t>(f) + 1]; ++s)
      if (t[static_cast<size_t>(s)] >= options.min_probability)
        entries.push_back({pairs.targets[static_cast<size_t>(s)], t[static_cast<size_t>(s)]});
    std::stable_sort(entries.begin(), entries.end(),
                     [](const LexicalEntry& a, const LexicalEntry& b) { return a.probability > b.probability; });
    if (static_cast<int64_t>(entries.size()) > options.keep) entries.resize(static_cast<size_t>(options.keep));
  }
  return lexicon;
}

std::span<const LexicalEntry> Lexicon::translations(int64_t source) const {
  if (source < 0 || source >= static_cast<int64_t>(translations_.size())) return {};
  return translations_[static_cast<size_t>(source)];
}

std::vector<int64_t> Lexicon::shortlist(std::span<const std::vector<int64_t>> sources, int64_t first, int64_t best,
                                        bool shared_vocabulary) const {
  MF_CHECK(first >= 0 && best >= 0, "Lexicon::shortlist: first and best must be at least 0, got {} and {}", first,
           best);
  std::vector<int64_t> ids;
  if (targets_by_frequency_.empty())
    for (int64_t id = 0; id < first; ++id) ids.push_back(id);
  else
    ids.assign(targets_by_frequency_.begin(),
               targets_by_frequency_.begin() + std::min(first, static_cast<int64_t>(targets_by_frequency_.size())));
  for (const std::vector<int64_t>& sentence : sources)
    for (int64_t f : sentence) {
      if (shared_vocabulary) ids.push_back(f);
      std::span<const LexicalEntry> entries = translations(f);
      for (size_t k = 0; k < entries.size() && static_cast<int64_t>(k) < best; ++k) ids.push_back(entries[k].target);
    }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

int64_t Lexicon::sources() const {
  return std::count_if(translations_.begin(), translations_.end(),
                       [](const std::vector<LexicalEntry>& entries) { return !entries.empty(); });
}

void Lexicon::save(const std::filesystem::path& path, const TextCodec& source, const TextCodec& target) const {
  std::string text;
  for (size_t f = 0; f < translations_.size(); ++f)
    for (const LexicalEntry& entry : translations_[f]) {
      MF_CHECK(static_cast<int64_t>(f) < source.size() && entry.target < target.size(),
               "Lexicon::save: source id {} or target id {} is outside the codecs ({} and {} ids)", f, entry.target,
               source.size(), target.size());
      const std::string& source_unit = source.unit(static_cast<int64_t>(f));
      const std::string& target_unit = target.unit(entry.target);
      MF_CHECK(!holds_space(source_unit) && !holds_space(target_unit),
               "Lexicon::save: the unit '{}' holds white space, which the file's columns cannot",
               holds_space(source_unit) ? source_unit : target_unit);
      // "{}": the shortest text that reads back as the same double.
      text += fmt::format("{} {} {}\n", target_unit, source_unit, entry.probability);
    }
  write_file_atomic(path, text, "lexicon");
}

Lexicon Lexicon::load(const std::filesystem::path& path, const TextCodec& source, const TextCodec& target) {
  std::ifstream in = detail::open_input(path, "lexicon");
  const std::unordered_map<std::string, int64_t> source_ids = ids_by_unit(source), target_ids = ids_by_unit(target);
  Lexicon lexicon;
  lexicon.targets_by_frequency_ = target.ids_by_frequency();
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream fields(line);
    std::string target_unit, source_unit, probability_text, extra;
    MF_CHECK(fields >> target_unit >> source_unit >> probability_text && !(fields >> extra),
             "lexicon '{}', line {}: expected \"target source probability\", got '{}'", path.string(), number, line);
    double probability = 0;
    const char* end = probability_text.data() + probability_text.size();
    const auto [stop, error] = std::from_chars(probability_text.data(), end, probability);
    MF_CHECK(error == std::errc() && stop == end && probability >= 0 && probability <= 1,
             "lexicon '{}', line {}: the probability '{}' is not a number in [0, 1]", path.string(), number,
             probability_text);
    const auto found_source = source_ids.find(source_unit);
    const auto found_target = target_ids.find(target_unit);
    MF_CHECK(found_source != source_ids.end(), "lexicon '{}', line {}: the source unit '{}' is not in the model's {}",
             path.string(), number, source_unit, source.describe());
    MF_CHECK(found_target != target_ids.end(), "lexicon '{}', line {}: the target unit '{}' is not in the model's {}",
             path.string(), number, target_unit, target.describe());
    const auto f = static_cast<size_t>(found_source->second);
    if (lexicon.translations_.size() <= f) lexicon.translations_.resize(f + 1);
    lexicon.translations_[f].push_back({found_target->second, probability});
  }
  MF_CHECK(!in.bad(), "cannot read lexicon '{}'", path.string());
  for (std::vector<LexicalEntry>& entries : lexicon.translations_)
    std::stable_sort(entries.begin(), entries.end(),
                     [](const LexicalEntry& a, const LexicalEntry& b) { return a.probability > b.probability; });
  return lexicon;
}

}  // namespace mf::text
