// A character-level GPT written with miniflow's public API, the program README's "Write your own model"
// walks through: a Module with holders, AdamW with decay groups and a warmup + cosine schedule, a
// DataLoader, a checkpoint saved and reloaded, and sampling with a key/value cache.
#include <miniflow/miniflow.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>

using namespace mf;

struct Config { int64_t vocabulary, width = 128, heads = 4, layers = 2, context = 320; };

struct BlockImpl : nn::Module {  // pre-norm: x + attention(norm(x)), then x + mlp(norm(x))
  explicit BlockImpl(const Config& c) : Module("Block") {
    norm1 = register_module("norm1", nn::LayerNorm(c.width));
    attention = register_module("attention", nn::MultiHeadAttention({.embed_dim = c.width, .num_heads = c.heads,
                                                                     .causal = true}));
    norm2 = register_module("norm2", nn::LayerNorm(c.width));
    mlp = register_module("mlp", nn::Sequential(nn::Linear(c.width, 4 * c.width), nn::GELU({.approximate = "tanh"}),
                                                nn::Linear(4 * c.width, c.width)));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x + attention(norm1(x));
    return h + mlp(norm2(h));
  }
  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  nn::MultiHeadAttention attention{nullptr};
  nn::Sequential mlp{nullptr};
};
MF_MODULE(Block);

struct GptImpl : nn::Module {
  explicit GptImpl(const Config& c) : Module("Gpt") {
    tokens = register_module("tokens", nn::Embedding(c.vocabulary, c.width));
    positions = register_module("positions", nn::Embedding(c.context, c.width));
    blocks = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(Block(c));
    norm = register_module("norm", nn::LayerNorm(c.width));
    head = register_module("head", nn::Linear(c.width, c.vocabulary, false));
    nn::tie_weights(*head, *tokens);  // one [V, C] matrix embeds and predicts
    for (Tensor* table : {&tokens->weight, &positions->weight}) nn::init::normal_(*table, 0.0, 0.02);  // GPT-2's
  }
  Tensor forward(const Tensor& ids) override {  // [B, T] -> logits [B, T, V]
    int64_t start = nn::cache_position();       // 0 unless generating with the cache
    Tensor x = tokens(ids) + positions(arange(start, start + ids.size(1), 1, DType::Int64));
    for (const auto& block : *blocks) x = (*block)(x);
    return head(norm(x));
  }
  nn::Embedding tokens{nullptr}, positions{nullptr};
  nn::ModuleList blocks{nullptr};
  nn::LayerNorm norm{nullptr};
  nn::Linear head{nullptr};
};
MF_MODULE(Gpt);

struct Windows : data::Dataset {  // example i: characters [i, i + T) and, shifted by one, the targets
  Windows(Tensor ids, int64_t length) : ids(std::move(ids)), length(length) {}
  int64_t size() const override { return ids.size(0) - length; }
  data::Example get(int64_t i) const override { return {ids.narrow(0, i, length), ids.narrow(0, i + 1, length)}; }
  Tensor ids;  // [characters] int64
  int64_t length;
};

int main(int argc, char** argv) try {
  std::string text_path = "examples/char_gpt.txt";
  int64_t steps = 300;
  bool compare_cache = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--compare-cache") compare_cache = true;
    else if (flag == "--text" && ++i < argc) text_path = value;
    else if (flag == "--steps" && ++i < argc) steps = std::stoll(value);
    else return std::cerr << "usage: char_gpt [--text FILE] [--steps N] [--compare-cache]\n", 2;
  }
  std::string text{std::istreambuf_iterator<char>(std::ifstream(text_path).rdbuf()), {}}, alphabet = text;
  std::sort(alphabet.begin(), alphabet.end());
  alphabet.erase(std::unique(alphabet.begin(), alphabet.end()), alphabet.end());
  if (text.size() < 100) return std::cerr << "char_gpt: cannot read 100 characters from " << text_path << "\n", 1;
  std::vector<int64_t> ids;
  for (char ch : text) ids.push_back(static_cast<int64_t>(alphabet.find(ch)));

  manual_seed(0);
  Config config{.vocabulary = static_cast<int64_t>(alphabet.size())};
  Gpt model(config);
  std::vector<Tensor> decayed, plain;  // weight decay on matrices only, as nanoGPT and minGPT do
  for (const auto& [name, p] : model->named_parameters()) (p.dim() >= 2 ? decayed : plain).push_back(p);
  optim::AdamW optimizer({{decayed, {.lr = 3e-3, .weight_decay = 0.1}}, {plain, {.lr = 3e-3, .weight_decay = 0}}});
  optim::LinearWarmupCosine schedule(optimizer, std::min<int64_t>(30, steps / 10), std::max<int64_t>(steps, 1), 3e-4);
  data::DataLoader loader(Windows(from_vector(ids), 64), {.batch_size = 32, .shuffle = true, .drop_last = true});
  for (int64_t step = 0; step < steps;) {  // epochs, each a new shuffle, until `steps` updates
    for (const data::Example& batch : loader) {
      Tensor loss = cross_entropy(model(batch.input).view({-1, config.vocabulary}), batch.target.view({-1}));
      optimizer.zero_grad();
      loss.backward();
      optim::clip_grad_norm_(model->parameters(), 1.0);
      optimizer.step();
      schedule.step();
      if (++step % 50 == 0 || step == steps) std::cout << "step " << step << "  loss " << loss.item<double>() << "\n";
      if (step == steps) break;
    }
  }
  nn::save(*model, "char_gpt.safetensors", {{"alphabet", alphabet}});
  Gpt reloaded(config);
  nn::load(*reloaded, "char_gpt.safetensors");
  generation::GenerateOptions options{.max_new_tokens = 63, .sampling = {.temperature = 0.8, .top_k = 10}};
  Tensor prompt = from_vector(std::vector<int64_t>{ids[0]}, {1, 1});
  for (int64_t id : generation::generate(reloaded, prompt, options).to_vector<int64_t>()) std::cout << alphabet[id];
  std::cout << "\n";
  for (bool cache : compare_cache ? std::vector{true, false} : std::vector<bool>{}) {  // cache or whole window
    options = {.max_new_tokens = 256, .sampling = options.sampling, .use_cache = cache};
    auto start = std::chrono::steady_clock::now();
    generation::generate(reloaded, prompt, options);
    std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
    std::cout << (cache ? "with the cache: " : "re-running the window: ") << 256 / seconds.count() << " tokens/s\n";
  }
} catch (const std::exception& error) {  // mf::Error included: a message, not a crash
  return std::cerr << "char_gpt: " << error.what() << "\n", 1;
}
