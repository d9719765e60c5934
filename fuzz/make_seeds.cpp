// Writes the fuzz targets' seed corpus: small valid inputs of each format, plus a few invalid ones
// near the edges the readers check. The files are committed under tests/fuzz_corpus/; rerun after a
// format change:
//
//   bash tools/fuzz.sh --build-only && build-fuzz/fuzz/make_fuzz_seeds tests/fuzz_corpus
#include "miniflow.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

void write(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  MF_CHECK(out.good(), "make_fuzz_seeds: cannot write '{}'", path.string());
}

std::string text_of(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

/// A safetensors file from a header written by hand and its data buffer: for what the writer
/// refuses to produce (dtypes miniflow lacks, broken offsets).
std::string raw_safetensors(const std::string& header, const std::string& buffer) {
  const uint64_t n = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, 8);
  return bytes + header + buffer;
}

void safetensors_seeds(const fs::path& dir) {
  const std::string valid = text_of(mf::serialize_safetensors(
      std::vector<mf::TensorRecord>{
          mf::nn::to_record("weight", mf::arange(0, 6, 1, mf::DType::Float32).view({2, 3})),
          mf::nn::to_record("ids", mf::from_vector(std::vector<int64_t>{7, -1}, {2})),
          mf::nn::to_record("scale", mf::full({}, 0.5, mf::DType::Float64)),
          mf::nn::to_record("mask", mf::from_vector(std::vector<double>{1, 0, 0, 1}, {2, 2}).to(mf::DType::Bool)),
          mf::nn::to_record("empty", mf::zeros({0, 3}))},
      {{"format", "pt"}}));
  write(dir / "valid.safetensors", valid);
  write(dir / "f16_skipped.safetensors",
        raw_safetensors(R"({"half":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                        R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        std::string("\x00\x3c\x00\xc0\x00\x00\x80\x3f", 8)));
  write(dir / "truncated.safetensors", valid.substr(0, valid.size() - 5));
  write(dir / "huge_header_size.safetensors", std::string("\x00\x00\x00\x00\x00\x01\x00\x00{}", 10));
  write(dir / "overlap.safetensors",
        raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        std::string(8, '\0')));
}

/// A tiny translator (4 tokens besides the specials, d_model 4), one Adam step trained, saved with
/// its optimizer, schedulers and generator as train_transformer --resume reads it.
void checkpoint_seeds(const fs::path& dir) {
  mf::manual_seed(1);
  mf::text::Corpus corpus = mf::text::make_corpus({{"ein test", "a test"}, {"kleiner hund", "small dog"}});
  mf::text::TokenCounts src_counts, tgt_counts;
  mf::text::count_tokens(corpus.sources, src_counts);
  mf::text::count_tokens(corpus.targets, tgt_counts);
  mf::text::Vocab src = mf::text::Vocab::build(src_counts), tgt = mf::text::Vocab::build(tgt_counts);
  mf::models::TransformerConfig config{.src_vocab = src.size(), .tgt_vocab = tgt.size(), .d_model = 4, .heads = 2,
                                       .encoder_layers = 1, .decoder_layers = 1, .d_ff = 8, .dropout = 0.0,
                                       .max_len = 8, .shared_embeddings = false};
  mf::models::Translator translator(config, src, tgt, {});
  mf::models::Transformer& model = translator.model();
  mf::optim::Adam adam(model.parameters(), {.lr = 1.0, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  mf::optim::NoamLR schedule(adam, config.d_model, 4000, 1.0);
  mf::optim::ReduceLROnPlateau plateau(adam);
  std::vector<std::vector<int64_t>> src_ids{src.encode(corpus.sources[0])}, tgt_ids{tgt.encode(corpus.targets[0])};
  std::vector<int64_t> rows{0};
  mf::models::TranslationBatch batch = mf::models::make_translation_batch(src_ids, tgt_ids, rows);
  model.loss(model.forward(batch.src, batch.tgt_in), batch.tgt_out, 0.0).backward();
  adam.step();
  schedule.step();
  plateau.step(1.0);

  const fs::path resume = dir / "translator_resume.safetensors";
  translator.save(resume, {.optimizer = &adam, .scheduler = &schedule, .plateau = &plateau,
                           .generator = &mf::default_generator()});
  translator.save(dir / "translator_only.safetensors");
  mf::nn::save_tensors(dir / "not_translator.safetensors", {{"weight", mf::zeros({2, 2})}});
  // The resume file with its optimizer JSON cut short: valid safetensors, broken metadata.
  mf::nn::TensorFile file = mf::nn::load_tensors(resume);
  const std::string& optimizer = file.metadata.at("miniflow.optimizer");
  file.metadata.set("miniflow.optimizer", optimizer.substr(0, optimizer.size() / 2));
  mf::nn::save_tensors(dir / "bad_optimizer_json.safetensors", file.tensors, file.metadata);
}

void vocab_seeds(const fs::path& dir) {
  mf::text::TokenCounts counts;
  mf::text::count_tokens({{"der", "hund", "läuft", "über", "die", "straße", "."}, {"„", "hallo", "“", "der"}}, counts);
  write(dir / "vocab.json", mf::text::Vocab::build(counts).to_json());
  write(dir / "specials_only.json", mf::text::Vocab().to_json());
  write(dir / "duplicate.json",
        R"({"format": "miniflow-vocab", "version": 1, "tokens": ["<pad>", "<sos>", "<eos>", "<unk>", "a", "a"]})");
  write(dir / "missing_special.json", R"({"format": "miniflow-vocab", "version": 1, "tokens": ["<pad>", "<sos>"]})");
  write(dir / "wrong_version.json", R"({"format": "miniflow-vocab", "version": 2, "tokens": []})");
}

/// See fuzz_corpus.cpp for the layout: option byte, source text, NUL, target text.
void corpus_seeds(const fs::path& dir) {
  auto seed = [&](const char* name, uint8_t flags, std::string_view source, std::string_view target) {
    write(dir / name, std::string(1, static_cast<char>(flags)) + std::string(source) + '\0' + std::string(target));
  };
  seed("german_english", 0x03, "Ein Hund läuft über die Straße.\nZwei „Katzen“ schlafen – leise!\n",
       "A dog crosses the street.\nTwo \"cats\" sleep, quietly!\n");
  seed("unicode_spaces", 0x01 | (4 << 3), "a\xc2\xa0" "b\tc\xe2\x80\x8b" "d\xef\xbb\xbf" "e f g\r\n",
       "\xce\x91\xce\x92\xce\x93 \xd0\x96\xd0\x98\xd0\x9b\xd0\x98 \xc3\x84\xc3\x96\xc3\x9c\xc3\x9f\n");
  seed("invalid_utf8", 0x02, "caf\xc3 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf ok\n", "\x80\x80 x\n");
  seed("skip_blank", 0x07, "one\n\n  \nthree\n", "eins\nzwei\ndrei\n\n");
  seed("blank_line", 0x03, "one\n\nthree\n", "eins\nzwei\ndrei\n");
  seed("line_counts_differ", 0x03, "one\ntwo\nthree\n", "eins\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: make_fuzz_seeds DIR   (writes DIR/{{safetensors,checkpoint,vocab,corpus}}/...)\n");
    return 2;
  }
  try {
    const fs::path root = argv[1];
    for (const char* target : {"safetensors", "checkpoint", "vocab", "corpus"}) fs::create_directories(root / target);
    safetensors_seeds(root / "safetensors");
    checkpoint_seeds(root / "checkpoint");
    vocab_seeds(root / "vocab");
    corpus_seeds(root / "corpus");
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "make_fuzz_seeds: {}\n", error.what());
    return 1;
  }
}
