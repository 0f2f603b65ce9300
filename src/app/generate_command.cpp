// `mpiddp generate`: text from a built-in GPT's snapshot by nanoGPT's sampling rule (GptImpl::
// generate). The snapshot holds the model's shape (the run's options, "gpt"), so no shape flags.
// Tokens come out as bytes for a byte vocabulary, as text through an llm.c tokenizer file, else
// as token ids.
#include <mpiddp/error.hpp>
#include <mpiddp/gpt.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/snapshot.hpp>

#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "app/cli.hpp"
#include "app/option_table.hpp"
#include "common/text.hpp"
#include "snapshot/snapshot_codec.hpp"

namespace mpiddp::app {

namespace {

constexpr uint32_t kTokenizerMagic = 20240328;  // llm.c's tokenizer.bin (train_gpt2.py writes it)

// llm.c's tokenizer file: a header of 256 uint32 ([0] magic, [1] version 1 or 2, [2] vocabulary
// size, [3] the end-of-text token in version 2), then per token its length (one byte) and bytes.
// Only decoding is possible from it (it holds no merges).
std::vector<std::string> read_tokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MPIDDP_CHECK(in.good(), "cannot open tokenizer '" + path + "'");
  std::vector<uint32_t> header(256);
  in.read(reinterpret_cast<char*>(header.data()), 1024);
  MPIDDP_CHECK(in.gcount() == 1024 && header[0] == kTokenizerMagic && (header[1] == 1 || header[1] == 2),
               "'" + path + "' is not an llm.c tokenizer file (magic 20240328, version 1 or 2)");
  std::vector<std::string> table(header[2]);
  for (auto& token : table) {
    unsigned char length = 0;
    in.read(reinterpret_cast<char*>(&length), 1);
    token.resize(length);
    in.read(token.data(), length);
    MPIDDP_CHECK(in.good() && length > 0, "tokenizer '" + path + "' is truncated or has an empty token");
  }
  return table;
}

// The GPT shape a snapshot records: its own key (every snapshot of the built-in GPT, trained by the
// CLI or the library), or the CLI's options of snapshots written before that key.
std::string gpt_config_of(const Snapshot& s, const std::string& name) {
  if (const auto it = s.texts.find(detail::kGptConfigKey); it != s.texts.end()) return it->second;
  const auto it = s.texts.find("config");
  const auto options = nlohmann::json::parse(it == s.texts.end() ? "" : it->second, nullptr, false);
  MPIDDP_CHECK(options.is_object() && options.contains("gpt"),
               "snapshot '" + name + "' is not of a built-in GPT (mpiddp train --model gpt)");
  return options["gpt"].dump();
}

// The GPT of a snapshot of the built-in GPT, with its trained weights.
Gpt gpt_of(const Snapshot& s, const std::string& name) {
  Gpt gpt(GptConfig::from_json(gpt_config_of(s, name)));
  try {
    load_named(*wrap_module(gpt), s.tensors, "model/");
  } catch (const Error& e) {
    MPIDDP_THROW("snapshot '" + name + "': " + e.message());
  }
  gpt->eval();
  return gpt;
}

std::vector<int64_t> token_list(const std::string& text) {
  std::vector<int64_t> ids;
  for (const auto& item : detail::split_list(text)) {
    size_t used = 0;
    try {
      ids.push_back(std::stoll(item, &used));
    } catch (const std::exception&) {
      used = 0;
    }
    MPIDDP_CHECK(used == item.size() && used > 0,
                 "--prompt-tokens takes token ids separated by commas, got '" + text + "'");
  }
  return ids;
}

// What the command line says; its initial values are the options' defaults.
struct GenerateConfig {
  std::string snapshot, prompt, prompt_tokens, tokenizer;
  int64_t max_new_tokens = 200, top_k = 0;
  double temperature = 1.0;
  uint64_t seed = 1337;
};

// Every `mpiddp generate` option, once.
const std::vector<OptionRow<GenerateConfig>>& generate_options() {
  using C = GenerateConfig;
  static const std::vector<OptionRow<C>> rows = {
      option<C>(
          "snapshot", [](C & c) -> auto& { return c.snapshot; }, "a snapshot of a --model gpt run", kNoDefault)
          .positional(),
      option<C>(
          "prompt", [](C & c) -> auto& { return c.prompt; },
          "the text to continue (its bytes: a byte-level vocabulary)", kNoDefault),
      option<C>(
          "prompt-tokens", [](C & c) -> auto& { return c.prompt_tokens; },
          "the prompt as token ids, comma-separated (any vocabulary)", kNoDefault),
      option<C>(
          "max-new-tokens", [](C & c) -> auto& { return c.max_new_tokens; }, "tokens to generate"),
      option<C>(
          "temperature", [](C & c) -> auto& { return c.temperature; }, "divides the logits (< 1: surer, > 1: wilder)"),
      option<C>(
          "top-k", [](C & c) -> auto& { return c.top_k; }, "draw from the k likeliest tokens only (0: all; 1: greedy)"),
      option<C>(
          "seed", [](C & c) -> auto& { return c.seed; }, "seed of the draws"),
      option<C>(
          "tokenizer", [](C & c) -> auto& { return c.tokenizer; },
          "llm.c's tokenizer file (gpt2_tokenizer.bin): print text, not token ids", kNoDefault),
  };
  return rows;
}

}  // namespace

int run_generate(Runtime& runtime, const std::vector<std::string>& args) {
  GenerateConfig c;
  const auto options = describe("mpiddp generate options", generate_options(), c);
  const auto positional = positionals(generate_options());
  return run_rank0_command(
      runtime, args,
      {"generate",
       "usage: mpiddp generate SNAPSHOT --prompt TEXT | --prompt-tokens ID,... [--max-new-tokens N]\n"
       "       [--temperature T] [--top-k K] [--seed S] [--tokenizer gpt2_tokenizer.bin]\n\n"
       "Continues a prompt with a built-in GPT's snapshot by nanoGPT's rule: crop to the block size,\n"
       "the last position's logits / T, the top K, softmax, one draw; repeated N times. Writes the\n"
       "prompt and what follows to stdout: as bytes for a byte vocabulary (mpiddp data text), as text\n"
       "with --tokenizer, else as token ids.\n\n",
       options, &positional,
       [&](const po::variables_map&) {
         MPIDDP_CHECK(!c.snapshot.empty(),
                      "say which snapshot to generate from (mpiddp generate SNAPSHOT --prompt TEXT)");
         MPIDDP_CHECK(c.prompt.empty() != c.prompt_tokens.empty(),
                      "give the prompt once: --prompt TEXT or --prompt-tokens IDS");
         MPIDDP_CHECK(c.max_new_tokens >= 0, "--max-new-tokens must be >= 0");
         MPIDDP_CHECK(c.temperature > 0, "--temperature must be > 0");
         MPIDDP_CHECK(c.top_k >= 0, "--top-k must be >= 0 (0: all tokens)");
       },
       [&] {
         const Snapshot s = read_snapshot(c.snapshot);
         auto gpt = gpt_of(s, c.snapshot);
         const int64_t vocab = gpt->config().vocab_size;
         std::vector<int64_t> ids = c.prompt_tokens.empty() ? std::vector<int64_t>(c.prompt.begin(), c.prompt.end())
                                                            : token_list(c.prompt_tokens);
         for (auto& id : ids) {
           if (c.prompt_tokens.empty()) id &= 0xFF;  // bytes, not signed chars
           MPIDDP_CHECK(id >= 0 && id < vocab, "prompt token " + std::to_string(id) +
                                                   " is outside the model's vocabulary of " + std::to_string(vocab));
         }
         const auto table = c.tokenizer.empty() ? std::vector<std::string>() : read_tokenizer(c.tokenizer);
         torch::manual_seed(c.seed);
         const auto out =
             gpt->generate(torch::tensor(ids, torch::kLong).unsqueeze(0), c.max_new_tokens, c.temperature, c.top_k);
         std::string text;
         for (int64_t i = 0; i < out.size(1); ++i) {
           const auto id = out[0][i].item<int64_t>();
           if (!table.empty()) {
             MPIDDP_CHECK(id < static_cast<int64_t>(table.size()),
                          "token " + std::to_string(id) + " is not in the tokenizer");
             text += table[static_cast<size_t>(id)];
           } else if (vocab <= 256) {
             text += static_cast<char>(id);
           } else {
             text += (i ? " " : "") + std::to_string(id);
           }
         }
         return table.empty() && vocab > 256 ? text + "\n" : text;
       }});
}

}  // namespace mpiddp::app
