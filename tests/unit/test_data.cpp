// Token files (run/data.hpp): llm.c's format (a 256 x int32 header, then uint16 or uint32 tokens)
// and flat uint16 files give the same samples for the same tokens; uint32 tokens beyond uint16's
// range arrive as they are; a file that disagrees with its header, of an unknown version or too
// short is refused with one line naming --data.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "run/data.hpp"
#include "strata/types.hpp"

namespace fs = std::filesystem;
using namespace strata;

namespace {

struct Dir {
  fs::path path = fs::temp_directory_path() / ("strata-data-" + std::to_string(::getpid()));
  Dir() { fs::create_directories(path); }
  ~Dir() { fs::remove_all(path); }
};

// `tokens` as a file: flat uint16 (version 0) or llm.c's version 1 (uint16) or 2 (uint32), with
// the header's count (`count` < 0: the true one).
std::string write(const Dir& d, const std::string& name, const std::vector<std::uint32_t>& tokens,
                  int version, long count = -1) {
  const std::string path = (d.path / name).string();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (version > 0) {
    std::int32_t header[256] = {20240520, version,
                                std::int32_t(count < 0 ? long(tokens.size()) : count)};
    std::fwrite(header, sizeof header, 1, f);
  }
  for (std::uint32_t t : tokens) {
    const std::uint16_t narrow = std::uint16_t(t);
    if (version == 2)
      std::fwrite(&t, 4, 1, f);
    else
      std::fwrite(&narrow, 2, 1, f);
  }
  std::fclose(f);
  return path;
}

std::string refusal(const std::string& path, int seq, int vocab) {
  try {
    check_token_file(path, seq, vocab);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

constexpr int kSeq = 16;

TEST(TokenFile, EveryFormatGivesTheSameSamples) {
  const Dir d;
  std::vector<std::uint32_t> tokens(5000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::uint32_t((i * 37 + 11) % 50257);
  const std::string flat = write(d, "flat.bin", tokens, 0), v1 = write(d, "v1.bin", tokens, 1),
                    v2 = write(d, "v2.bin", tokens, 2);
  for (const std::string& p : {flat, v1, v2}) check_token_file(p, kSeq, 50257);
  const auto a = make_token_file_source(flat, 7, kSeq, 50257);
  const auto b = make_token_file_source(v1, 7, kSeq, 50257);
  const auto c = make_token_file_source(v2, 7, kSeq, 50257);
  EXPECT_NE(a->describe().find("flat uint16, 5000 tokens"), std::string::npos) << a->describe();
  EXPECT_NE(b->describe().find("llm.c v1, uint16, 5000 tokens"), std::string::npos);
  EXPECT_NE(c->describe().find("llm.c v2, uint32, 5000 tokens"), std::string::npos);
  for (int step = 0; step < 3; ++step)
    for (std::int64_t sample = 0; sample < 4; ++sample) {
      std::int32_t in[3][kSeq], tg[3][kSeq];
      a->fill(step, sample, in[0], tg[0]);
      b->fill(step, sample, in[1], tg[1]);
      c->fill(step, sample, in[2], tg[2]);
      for (int k = 1; k < 3; ++k)
        for (int t = 0; t < kSeq; ++t) {
          ASSERT_EQ(in[k][t], in[0][t]) << "format " << k << " step " << step << " t " << t;
          ASSERT_EQ(tg[k][t], tg[0][t]);
        }
      for (int t = 0; t + 1 < kSeq; ++t) ASSERT_EQ(tg[0][t], in[0][t + 1]);  // the next token
    }
}

// Llama 3's vocabulary (128256) needs uint32 tokens: every window of a file counting 70000 up
// arrives as it is.
TEST(TokenFile, Uint32TokensBeyondUint16ArriveAsTheyAre) {
  const Dir d;
  std::vector<std::uint32_t> tokens(3000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::uint32_t(70000 + i);
  const std::string path = write(d, "wide.bin", tokens, 2);
  check_token_file(path, kSeq, 128256);
  const auto src = make_token_file_source(path, 3, kSeq, 128256);
  for (std::int64_t sample = 0; sample < 8; ++sample) {
    std::int32_t in[kSeq], tg[kSeq];
    src->fill(1, sample, in, tg);
    EXPECT_GE(in[0], 70000);
    for (int t = 0; t < kSeq; ++t) {
      EXPECT_EQ(in[t], in[0] + t);
      EXPECT_EQ(tg[t], in[0] + t + 1);
    }
  }
  EXPECT_NE(refusal(path, kSeq, 72000).find("token 72000 at 2000 is not below --vocab 72000"),
            std::string::npos)
      << refusal(path, kSeq, 72000);
  tokens[5] = 4294967295u;
  EXPECT_NE(refusal(write(d, "max.bin", tokens, 2), kSeq, 2147483647)
                .find("token 4294967295 at 5 is not below --vocab 2147483647"),
            std::string::npos);
}

TEST(TokenFile, RefusesWhatItCannotRead) {
  const Dir d;
  const std::vector<std::uint32_t> tokens(100, 3);
  const auto says = [&](const std::string& path, const std::string& what) {
    const std::string r = refusal(path, kSeq, 256);
    EXPECT_NE(r.find("--data " + path + ": " + what), std::string::npos) << r;
  };
  says(write(d, "v3.bin", tokens, 3),
       "llm.c token file of version 3; 1 (uint16 tokens) and 2 (uint32) are read");
  says(write(d, "count.bin", tokens, 2, 101), "its llm.c header says 101 tokens of 4 bytes");
  says(write(d, "short.bin", std::vector<std::uint32_t>(17, 1), 1),
       "has 17 tokens; a sequence of 16 needs at least 18");
  const std::string odd = (d.path / "odd.bin").string();
  FILE* f = std::fopen(odd.c_str(), "wb");
  std::fputs("abc", f);
  std::fclose(f);
  says(odd, "must be a flat file of uint16 tokens or an llm.c token file (it has 3 bytes)");
}

}  // namespace
