#include "text/vocab.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_brief.h"
#include "text/files.h"
#include "text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

namespace mf::text {
namespace {

constexpr std::string_view kFormat = "miniflow-vocab";
constexpr int kVersion = 1;

bool is_special(std::string_view token) {
  return std::find(kSpecialTokenTexts.begin(), kSpecialTokenTexts.end(), token) != kSpecialTokenTexts.end();
}

}  // namespace

void count_tokens(const std::vector<std::vector<std::string>>& sentences, TokenCounts& counts) {
  for (const auto& sentence : sentences)
    for (const std::string& token : sentence) ++counts[token];
}

Vocab::Vocab() : Vocab(std::vector<std::string>(kSpecialTokenTexts.begin(), kSpecialTokenTexts.end())) {}

Vocab::Vocab(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
  ids_.reserve(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) ids_.emplace(tokens_[id], static_cast<int64_t>(id));
}

Vocab Vocab::build(const TokenCounts& counts, const VocabOptions& options) {
  MF_CHECK(options.min_freq >= 1, "Vocab::build: min_freq must be at least 1, got {}", options.min_freq);
  MF_CHECK(options.max_size == 0 || options.max_size >= kSpecialTokenCount,
           "Vocab::build: max_size must be 0 (no limit) or at least {} (the special tokens), got {}", kSpecialTokenCount,
           options.max_size);
  std::vector<std::pair<std::string_view, int64_t>> kept;
  for (const auto& [token, count] : counts) {
    if (count < options.min_freq || is_special(token)) continue;
    MF_CHECK(!token.empty(), "Vocab::build: the counts hold an empty token");
    const size_t bad = find_invalid_utf8(token);
    MF_CHECK(bad == std::string_view::npos,
             "Vocab::build: token \"{}...\" is not valid UTF-8 (byte 0x{:02X} at offset {})", token.substr(0, bad),
             static_cast<unsigned char>(token[bad]), bad);
    kept.emplace_back(token, count);
  }
  // Hash map order differs between runs and libraries; a total order makes ids reproducible.
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (options.max_size > 0) kept.resize(std::min(kept.size(), static_cast<size_t>(options.max_size - kSpecialTokenCount)));

  std::vector<std::string> tokens(kSpecialTokenTexts.begin(), kSpecialTokenTexts.end());
  for (const auto& entry : kept) tokens.emplace_back(entry.first);
  return Vocab(std::move(tokens));
}

int64_t Vocab::id(std::string_view token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? kUnkId : it->second;
}

const std::string& Vocab::token(int64_t id) const {
  MF_CHECK(id >= 0 && id < size(), "Vocab::token: id {} is out of range for a vocabulary of {} tokens", id, size());
  return tokens_[static_cast<size_t>(id)];
}

std::vector<int64_t> Vocab::encode(const std::vector<std::string>& tokens, EncodeOptions options) const {
  std::vector<int64_t> ids;
  ids.reserve(tokens.size() + 2);
  if (options.add_sos) ids.push_back(kSosId);
  for (const std::string& token : tokens) ids.push_back(id(token));
  if (options.add_eos) ids.push_back(kEosId);
  return ids;
}

std::vector<std::string> Vocab::decode(std::span<const int64_t> ids) const {
  std::vector<std::string> tokens;
  for (size_t pos = 0; pos < ids.size(); ++pos) {
    const int64_t id = ids[pos];
    MF_CHECK(id >= 0 && id < size(),
             "Vocab::decode: id {} at position {} is out of range for a vocabulary of {} tokens", id, pos, size());
    if (id == kEosId) break;
    if (id == kPadId || id == kSosId) continue;
    tokens.push_back(tokens_[static_cast<size_t>(id)]);
  }
  return tokens;
}

std::string Vocab::to_json() const {
  const nlohmann::ordered_json doc = {{"format", std::string(kFormat)}, {"version", kVersion}, {"tokens", tokens_}};
  return doc.dump(1, ' ', /*ensure_ascii=*/false) + "\n";
}

Vocab Vocab::from_json(std::string_view json, std::string_view origin) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    fail("vocab from {}: invalid JSON ({})", origin, e.what());
  }
  MF_CHECK(doc.is_object(), "vocab from {}: expected a JSON object, got {}", origin, doc.type_name());
  auto format = doc.find("format");
  MF_CHECK(format != doc.end() && format->is_string() && format->get<std::string>() == kFormat,
           "vocab from {}: \"format\" is missing or not \"{}\"", origin, kFormat);
  auto version = doc.find("version");
  MF_CHECK(version != doc.end() && version->is_number_integer() && version->get<int64_t>() == kVersion,
           "vocab from {}: \"version\" is {} (this build reads version {})", origin,
           version == doc.end() ? "missing" : detail::brief_json(*version), kVersion);
  auto list = doc.find("tokens");
  MF_CHECK(list != doc.end() && list->is_array(), "vocab from {}: \"tokens\" is missing or not an array", origin);

  std::vector<std::string> tokens;
  std::unordered_map<std::string, size_t> first_id;
  for (size_t id = 0; id < list->size(); ++id) {
    const nlohmann::json& entry = (*list)[id];
    MF_CHECK(entry.is_string(), "vocab from {}: token at id {} is a {}, not a string", origin, id, entry.type_name());
    std::string token = entry.get<std::string>();
    MF_CHECK(!token.empty(), "vocab from {}: token at id {} is empty", origin, id);
    if (id < kSpecialTokenCount)
      MF_CHECK(token == kSpecialTokenTexts[id], "vocab from {}: id {} must be the special token \"{}\", found \"{}\"",
               origin, id, kSpecialTokenTexts[id], token);
    auto [it, inserted] = first_id.emplace(token, id);
    MF_CHECK(inserted, "vocab from {}: duplicate token \"{}\" at ids {} and {}", origin, token, it->second, id);
    tokens.push_back(std::move(token));
  }
  MF_CHECK(tokens.size() >= kSpecialTokenCount, "vocab from {}: the special token \"{}\" is missing (expected at id {})",
           origin, kSpecialTokenTexts[tokens.size()], tokens.size());
  return Vocab(std::move(tokens));
}

void Vocab::save(const std::filesystem::path& path) const { write_file_atomic(path, to_json(), "vocabulary"); }

Vocab Vocab::load(const std::filesystem::path& path) {
  std::ifstream in = detail::open_input(path, "Vocab::load:");
  std::ostringstream content;
  content << in.rdbuf();
  MF_CHECK(!in.bad(), "Vocab::load: reading '{}' failed", path.string());
  return from_json(content.str(), fmt::format("file '{}'", path.string()));
}

}  // namespace mf::text
