// End-to-end: `atelier models quantize` on stories260K pulled from the
// fixtures mirror: q8_0, llama.cpp's q4_k_m mix and the mixed recipe each
// install a new version with its lineage, the chosen types follow the
// recipe (with the fallbacks stories260K's 64- and 172-wide rows force), the
// new version generates, and the quality report ranks them; bad input exits 2.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_util.h"

using nlohmann::json;
using Out = atelier::test::CliRun;

namespace {

const std::string kFixtures = ATELIER_FIXTURES_DIR;
const std::string kDigest = "sha256:270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d";

struct Sandbox : atelier::test::ScratchDir {
  explicit Sandbox(const std::string& tag) : ScratchDir("atelier_quantize_" + tag) {}
  Out run(std::vector<std::string> args) const {
    args.push_back("--store");
    args.push_back((dir / "store").string());
    return atelier::test::run_atelier(args, dir);
  }
};

std::map<std::string, json> by_name(const json& tensors) {
  std::map<std::string, json> m;
  for (const auto& t : tensors) m[t["name"]] = t;
  return m;
}

}  // namespace

TEST(QuantizeCli, TypesAndRecipesInstallVersionsWithLineage) {
  Sandbox sb("recipes");
  ASSERT_EQ(sb.run({"models", "pull", "stories260k", "--mirror", kFixtures}).code, 0);

  Out q8 = sb.run({"models", "quantize", "stories260k", "--type", "q8_0", "--json"});
  ASSERT_EQ(q8.code, 0) << q8.err;
  const json a = json::parse(q8.out);
  EXPECT_EQ(a["model"], "stories260k@2");
  EXPECT_EQ(a["source_digest"], kDigest);
  EXPECT_LT(a["bytes"].get<double>(), a["source_bytes"].get<double>() * 0.5);
  EXPECT_LT(a["quality"]["mean_kl"].get<double>(), 0.01);
  // ffn_down's 172-wide rows hold no 32-wide block: F16, and said so.
  EXPECT_NE(q8.err.find("blk.0.ffn_down.weight: q8_0 -> f16"), std::string::npos) << q8.err;

  Out km = sb.run({"models", "quantize", "stories260k@1", "--recipe", "q4_k_m", "--json"});
  ASSERT_EQ(km.code, 0) << km.err;
  const json b = json::parse(km.out);
  EXPECT_EQ(b["model"], "stories260k@3");
  auto t = by_name(b["tensors"]);
  // llama.cpp's rule by hand for 5 layers: attn_v and ffn_down of layers 2 and 4
  // want Q6_K (use_more_bits), the rest Q4_K; output.weight (64 columns, not a
  // multiple of 256) Q8_0. No row here holds a 256-wide block, so all fall
  // back: Q6_K -> Q8_0; Q4_K -> llama.cpp's Q5_0, which the kernels do not
  // run, so the next type they run with as many bits, Q8_0; and F16 for the
  // 172-wide rows.
  EXPECT_EQ(t["output.weight"]["type"], "q8_0");
  EXPECT_FALSE(t["output.weight"].contains("wanted"));
  EXPECT_EQ(t["token_embd.weight"]["wanted"], "q4_K");
  EXPECT_EQ(t["token_embd.weight"]["type"], "q8_0");
  EXPECT_EQ(t["blk.2.attn_v.weight"]["type"], "q8_0");
  EXPECT_EQ(t["blk.2.attn_v.weight"]["wanted"], "q6_K");
  EXPECT_EQ(t["blk.4.attn_v.weight"]["wanted"], "q6_K");
  EXPECT_EQ(t["blk.0.attn_v.weight"]["wanted"], "q4_K");
  EXPECT_EQ(t["blk.3.attn_v.weight"]["wanted"], "q4_K");
  EXPECT_EQ(t["blk.1.attn_q.weight"]["type"], "q8_0");
  EXPECT_EQ(t["blk.2.ffn_down.weight"]["wanted"], "q6_K");
  EXPECT_EQ(t["blk.2.ffn_down.weight"]["type"], "f16");
  EXPECT_EQ(t["blk.1.ffn_down.weight"]["wanted"], "q4_K");
  EXPECT_EQ(t["blk.0.attn_norm.weight"]["type"], "f32");
  EXPECT_NE(km.err.find("blk.2.attn_v.weight: q6_K -> q8_0 (rows of 64 are not a multiple of 256)"), std::string::npos) << km.err;

  Out mx = sb.run({"models", "quantize", "stories260k@1", "--recipe", "mixed", "--name", "tiny-mixed", "--json"});
  ASSERT_EQ(mx.code, 0) << mx.err;
  const json c = json::parse(mx.out);
  EXPECT_EQ(c["model"], "tiny-mixed@1");
  t = by_name(c["tensors"]);
  EXPECT_EQ(t["token_embd.weight"]["type"], "q4_0");  // 64 columns: Q4_0, not Q4_K
  EXPECT_EQ(t["blk.3.attn_k.weight"]["type"], "f16");
  EXPECT_EQ(t["blk.3.attn_output.weight"]["type"], "f16");
  EXPECT_EQ(t["blk.3.ffn_up.weight"]["type"], "q8_0");

  // Fewer bits cost more. On stories260K q4_k_m's fallbacks make the same
  // tensors as q8_0, so the same logits and KL.
  const double kl8 = a["quality"]["mean_kl"], klm = b["quality"]["mean_kl"], klx = c["quality"]["mean_kl"];
  EXPECT_EQ(klm, kl8);
  EXPECT_GT(klx, kl8 * 2);
  EXPECT_GT(kl8, 0.0);
  EXPECT_DOUBLE_EQ(a["quality"]["perplexity_source"].get<double>(), b["quality"]["perplexity_source"].get<double>());

  // The lineage is on the version, and the new version generates.
  Out info = sb.run({"models", "info", "stories260k@3", "--json"});
  ASSERT_EQ(info.code, 0) << info.err;
  const json v = json::parse(info.out);
  const std::string notes = v["notes"];
  EXPECT_NE(notes.find(kDigest), std::string::npos) << notes;
  EXPECT_NE(notes.find("q4_k_m"), std::string::npos) << notes;
  EXPECT_NE(notes.find("stories260k@1"), std::string::npos) << notes;
  EXPECT_NE(notes.find("atelier 0.1.0"), std::string::npos) << notes;
  EXPECT_NE(v["quantization"].get<std::string>().find("q8_0"), std::string::npos) << v.dump();
  // Its greedy tokens against an independent reference: the fixture's golden
  // ids of the F32 model (the reference implementation's, see the fixtures
  // README), all 60 of them: a quantization that moves the greedy path fails
  // here even where its mean KL (bounded above) stays small.
  Out gen = sb.run({"text", "-m", "stories260k@3", "-p", "Once upon a time", "-n", "60", "--temp", "0", "--json"});
  ASSERT_EQ(gen.code, 0) << gen.err;
  json result;
  {
    std::istringstream lines(gen.out);
    for (std::string line; std::getline(lines, line);)
      if (auto j = json::parse(line); j["type"] != "token") result = j;
  }
  std::vector<int> golden;
  {
    std::istringstream ids(atelier::test::slurp(kFixtures + "/text/golden-once-upon-a-time-greedy.ids"));
    for (int id; ids >> id;) golden.push_back(id);
  }
  ASSERT_EQ(golden.size(), 65u);
  EXPECT_EQ(result["ids"].get<std::vector<int>>(), golden);
  EXPECT_GT(b["quality"]["top1_agreement"].get<double>(), 0.95);

  // The people's table names size, bytes per token and the quality figures; --text takes any file.
  Out human = sb.run({"models", "quantize", "stories260k@1", "--type", "q4_0", "--text",
                      kFixtures + "/text/golden-once-upon-a-time-greedy.txt"});
  ASSERT_EQ(human.code, 0) << human.err;
  for (const char* word : {"size:", "bytes per token:", "perplexity", "mean KL", "top-1 agreement", "lineage:"})
    EXPECT_NE(human.out.find(word), std::string::npos) << word << "\n" << human.out;

  // compare scores any two versions.
  Out cmp = sb.run({"models", "compare", "stories260k@1", "stories260k@2", "--json"});
  ASSERT_EQ(cmp.code, 0) << cmp.err;
  EXPECT_NEAR(json::parse(cmp.out)["mean_kl"].get<double>(), kl8, 1e-12);
}

TEST(QuantizeCli, BadInputExitsTwoWithAClearMessage) {
  Sandbox sb("bad");
  ASSERT_EQ(sb.run({"models", "pull", "stories260k", "--mirror", kFixtures}).code, 0);
  Out unknown = sb.run({"models", "quantize", "stories260k", "--type", "q3_0"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("unknown weight type 'q3_0'"), std::string::npos) << unknown.err;
  EXPECT_NE(unknown.err.find("q4_K"), std::string::npos) << unknown.err;
  Out recipe = sb.run({"models", "quantize", "stories260k", "--recipe", "q4_k_xl"});
  EXPECT_EQ(recipe.code, 2);
  EXPECT_NE(recipe.err.find("q4_k_m"), std::string::npos) << recipe.err;
  Out neither = sb.run({"models", "quantize", "stories260k"});
  EXPECT_EQ(neither.code, 2);
  EXPECT_NE(neither.err.find("--type"), std::string::npos) << neither.err;
  Out missing = sb.run({"models", "quantize", "no-such-model", "--type", "q8_0"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("no-such-model"), std::string::npos) << missing.err;
  Out text = sb.run({"models", "quantize", "stories260k", "--type", "q8_0", "--text", "/no/such/text.txt"});
  EXPECT_EQ(text.code, 2);
  EXPECT_NE(text.err.find("/no/such/text.txt"), std::string::npos) << text.err;

  ASSERT_EQ(sb.run({"models", "quantize", "stories260k", "--type", "q8_0", "--no-quality"}).code, 0);
  Out twice = sb.run({"models", "quantize", "stories260k@2", "--type", "q4_0"});
  EXPECT_EQ(twice.code, 2);
  EXPECT_NE(twice.err.find("already quantized"), std::string::npos) << twice.err;
  EXPECT_NE(twice.err.find("F32, F16 or BF16"), std::string::npos) << twice.err;
  EXPECT_NE(twice.err.find("e.g. stories260k@1"), std::string::npos) << twice.err;  // the float version to use
  // Nothing was installed by the refusals.
  Out list = sb.run({"models", "list", "--json"});
  EXPECT_EQ(json::parse(list.out)["versions"].size(), 2u) << list.out;
}
