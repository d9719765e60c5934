#include "text/codec.h"

#include "core/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <numeric>

namespace mf::text {
namespace {

constexpr std::string_view kBase64Digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// A subword model's bytes go into JSON, which holds text: base64 (RFC 4648).
std::string to_base64(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t group = 0;
    for (size_t k = 0; k < 3; ++k) group = group << 8 | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? kBase64Digits[group >> (18 - 6 * k) & 63] : '=');
  }
  return out;
}

std::string from_base64(std::string_view text, std::string_view what) {
  MF_CHECK(text.size() % 4 == 0, "{} is not base64: {} characters is not a multiple of 4", what, text.size());
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t group = 0;
    size_t padding = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      const size_t digit = kBase64Digits.find(c);
      const bool last_padding = c == '=' && i + 4 == text.size() && k >= 2 && (k == 3 || text[i + 3] == '=');
      MF_CHECK(digit != std::string_view::npos || last_padding, "{} is not base64: character {} is '{}'", what,
               i + k, c);
      padding += last_padding;
      group = group << 6 | (last_padding ? 0u : static_cast<uint32_t>(digit));
    }
    for (size_t k = 0; k < 3 - padding; ++k) out.push_back(static_cast<char>(group >> (16 - 8 * k) & 255));
  }
  return out;
}

}  // namespace

TextCodec::TextCodec(Vocab vocab, TokenizerOptions tokenizer) : codec_(Words{std::move(vocab), Tokenizer(tokenizer)}) {}

TextCodec::TextCodec(SubwordModel model) : codec_(std::move(model)) {}

std::vector<int64_t> TextCodec::encode(std::string_view text) const {
  if (const Words* words = std::get_if<Words>(&codec_)) return words->vocab.encode(words->tokenizer.tokenize(text));
  return std::get<SubwordModel>(codec_).encode(text);
}

std::string TextCodec::decode(std::span<const int64_t> ids) const {
  if (const Words* words = std::get_if<Words>(&codec_)) return Tokenizer::detokenize(words->vocab.decode(ids));
  return std::get<SubwordModel>(codec_).decode(ids);
}

std::vector<std::string> TextCodec::units(std::string_view text) const {
  if (const Words* words = std::get_if<Words>(&codec_)) return words->tokenizer.tokenize(text);
  return std::get<SubwordModel>(codec_).pieces(text);
}

std::vector<int64_t> TextCodec::word_indices(std::span<const int64_t> ids) const {
  if (const SubwordModel* model = subwords()) return model->word_indices(ids);
  std::vector<int64_t> out(ids.size(), -1);
  int64_t word = 0;
  for (size_t i = 0; i < ids.size() && ids[i] != kEosId; ++i)
    if (ids[i] != kPadId && ids[i] != kSosId) out[i] = word++;
  return out;
}

const std::string& TextCodec::unit(int64_t id) const {
  if (const Words* words = std::get_if<Words>(&codec_)) return words->vocab.token(id);
  return std::get<SubwordModel>(codec_).piece(id);
}

int64_t TextCodec::size() const {
  if (const Words* words = std::get_if<Words>(&codec_)) return words->vocab.size();
  return std::get<SubwordModel>(codec_).size();
}

bool TextCodec::spells_everything() const { return subwords() != nullptr && subwords()->byte_fallback(); }

std::vector<int64_t> TextCodec::control_character_ids() const {
  if (const SubwordModel* model = subwords()) return model->control_character_ids();
  return {};
}

std::vector<int64_t> TextCodec::ids_by_frequency() const {
  if (const SubwordModel* model = subwords()) return model->ids_by_frequency();
  std::vector<int64_t> ids(static_cast<size_t>(size()));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return ids;
}

const Vocab* TextCodec::words() const {
  const Words* words = std::get_if<Words>(&codec_);
  return words ? &words->vocab : nullptr;
}

const TokenizerOptions* TextCodec::tokenizer() const {
  const Words* words = std::get_if<Words>(&codec_);
  return words ? &words->tokenizer.options() : nullptr;
}

const SubwordModel* TextCodec::subwords() const { return std::get_if<SubwordModel>(&codec_); }

std::string TextCodec::describe() const {
  if (const Words* words = std::get_if<Words>(&codec_))
    return fmt::format("words ({}, {})", words->vocab.size(),
                       words->tokenizer.options().lowercase ? "lowercased" : "cased");
  return fmt::format("subwords (SentencePiece, {})", size());
}

bool TextCodec::operator==(const TextCodec& other) const {
  const Words *mine = std::get_if<Words>(&codec_), *theirs = std::get_if<Words>(&other.codec_);
  if (mine && theirs)
    return mine->vocab == theirs->vocab &&
           mine->tokenizer.options().lowercase == theirs->tokenizer.options().lowercase &&
           mine->tokenizer.options().split_punctuation == theirs->tokenizer.options().split_punctuation;
  return subwords() && other.subwords() && *subwords() == *other.subwords();
}

std::string TextCodec::to_json() const {
  if (const Words* words = std::get_if<Words>(&codec_))
    return nlohmann::json{{"kind", "words"},
                          {"vocab", nlohmann::json::parse(words->vocab.to_json())},
                          {"lowercase", words->tokenizer.options().lowercase},
                          {"split_punctuation", words->tokenizer.options().split_punctuation}}
        .dump();
  return nlohmann::json{{"kind", "sentencepiece"}, {"model", to_base64(subwords()->bytes())}}.dump();
}

TextCodec TextCodec::from_json(std::string_view json, std::string_view origin) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  auto field = [&](const char* key, auto check, const char* type) -> const nlohmann::json& {
    MF_CHECK(j.is_object() && j.contains(key) && check(j[key]), "{}: malformed text codec: no {} '{}'", origin, type,
             key);
    return j[key];
  };
  const std::string kind = field("kind", [](const nlohmann::json& v) { return v.is_string(); }, "string")
                               .get<std::string>();
  if (kind == "sentencepiece") {
    const std::string& text = field("model", [](const nlohmann::json& v) { return v.is_string(); }, "string")
                                  .get_ref<const std::string&>();
    const std::string what = fmt::format("{} (subword model)", origin);
    return TextCodec(SubwordModel::from_bytes(from_base64(text, what), what));
  }
  MF_CHECK(kind == "words", "{}: unknown text codec kind '{}' (known: words, sentencepiece)", origin, kind);
  auto is_bool = [](const nlohmann::json& v) { return v.is_boolean(); };
  const TokenizerOptions tokenizer{.lowercase = field("lowercase", is_bool, "boolean").get<bool>(),
                                   .split_punctuation = field("split_punctuation", is_bool, "boolean").get<bool>()};
  const nlohmann::json& vocab = field("vocab", [](const nlohmann::json& v) { return v.is_object(); }, "object");
  return TextCodec(Vocab::from_json(vocab.dump(), fmt::format("{} (vocabulary)", origin)), tokenizer);
}

}  // namespace mf::text
