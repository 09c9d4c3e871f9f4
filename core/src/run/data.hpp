// Training data. Sample s of step k is a pure function of (seed, k, s), so every strategy at every
// world size sees the same global batch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // inputs[T], targets[T] (the next tokens) of global sample `sample` of step `step`.
  virtual void fill(int step, std::int64_t sample, std::int32_t* inputs,
                    std::int32_t* targets) const = 0;
  virtual std::string describe() const = 0;
};

// Learnable synthetic tokens: a hidden random permutation P of the vocabulary drives a noisy
// chain, next = P[current] with probability 3/4, otherwise uniform. The best achievable loss is
// well below ln(V), so a working model's loss falls fast.
std::unique_ptr<DataSource> make_synthetic_source(std::uint64_t seed, int seq, int vocab);

// A token file, in one of two formats, told apart by its first four bytes:
//   llm.c's   a header of 256 int32 (20240520, version, token count), then the tokens: version 1
//             uint16 (GPT-2's 50257), version 2 uint32 (Llama 3's 128256)
//   flat      uint16 tokens and nothing else (nanoGPT's)
// read with pread (not mapped, so a file changed during the run is an Error naming --data, not a
// SIGBUS); each sample is a window at an offset hashed from (seed, step, sample). Throws
// ConfigError on a bad file.
std::unique_ptr<DataSource> make_token_file_source(const std::string& path, std::uint64_t seed,
                                                   int seq, int vocab);

// Check a token file before any rank starts: a header that agrees with the file's size (or a
// whole number of flat uint16 tokens), at least seq + 2 tokens, every one below `vocab`. Throws
// ConfigError naming --data and the first problem.
void check_token_file(const std::string& path, int seq, int vocab);

}  // namespace strata
