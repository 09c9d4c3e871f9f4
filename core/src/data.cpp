#include "data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <numeric>

#include "hash.hpp"
#include "strata/types.hpp"

namespace strata {
namespace {

class Synthetic final : public DataSource {
 public:
  Synthetic(std::uint64_t seed, int seq, int vocab) : seed_(seed), seq_(seq), vocab_(vocab) {
    next_.resize(vocab);
    std::iota(next_.begin(), next_.end(), 0);
    for (int i = vocab - 1; i > 0; --i)  // Fisher-Yates from the seed
      std::swap(next_[i], next_[hash4(seed, 0xda7a, i, 0) % std::uint64_t(i + 1)]);
  }
  void fill(int step, std::int64_t sample, std::int32_t* inputs,
            std::int32_t* targets) const override {
    std::uint64_t key = hash4(seed_, 0x5a3e, std::uint64_t(step), std::uint64_t(sample));
    std::int32_t tok = std::int32_t(mix64(key) % vocab_);
    for (int t = 0; t <= seq_; ++t) {
      if (t < seq_) inputs[t] = tok;
      if (t > 0) targets[t - 1] = tok;
      std::uint64_t h = mix64(key ^ (std::uint64_t(t + 1) * 0x2545f4914f6cdd1dull));
      tok = (h & 3) != 0 ? next_[tok] : std::int32_t((h >> 2) % vocab_);
    }
  }
  std::string describe() const override { return "synthetic (permutation chain, p=0.75)"; }

 private:
  std::uint64_t seed_;
  int seq_, vocab_;
  std::vector<std::int32_t> next_;
};

// A read-only mapping of a token file whose size is checked.
struct MappedTokens {
  const std::uint16_t* tokens = nullptr;
  std::size_t bytes = 0, count = 0;
};

MappedTokens map_tokens(const std::string& path, int seq) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw ConfigError("--data " + path + ": cannot open the file");
  struct stat st {};
  MappedTokens m;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ConfigError("--data " + path + ": not a regular file");
  }
  m.bytes = std::size_t(st.st_size);
  m.count = m.bytes / sizeof(std::uint16_t);
  if (m.bytes % 2 != 0 || m.count < std::size_t(seq) + 2) {
    ::close(fd);
    throw ConfigError("--data " + path + ": must be a flat file of uint16 tokens with at least " +
                      std::to_string(std::int64_t(seq) + 2) + " tokens (it has " +
                      std::to_string(m.bytes) + " bytes)");
  }
  void* p = ::mmap(nullptr, m.bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw ConfigError("--data " + path + ": cannot memory-map the file");
  m.tokens = static_cast<const std::uint16_t*>(p);
  return m;
}

// The contents were checked before the ranks started (check_token_file).
class TokenFile final : public DataSource {
 public:
  TokenFile(const std::string& path, std::uint64_t seed, int seq)
      : path_(path), seed_(seed), seq_(seq), map_(map_tokens(path, seq)) {}
  ~TokenFile() override { ::munmap(const_cast<std::uint16_t*>(map_.tokens), map_.bytes); }
  void fill(int step, std::int64_t sample, std::int32_t* inputs,
            std::int32_t* targets) const override {
    std::size_t windows = map_.count - std::size_t(seq_);
    std::size_t start = hash4(seed_, 0xf11e, std::uint64_t(step), std::uint64_t(sample)) % windows;
    for (int t = 0; t < seq_; ++t) {
      inputs[t] = map_.tokens[start + t];
      targets[t] = map_.tokens[start + t + 1];
    }
  }
  std::string describe() const override {
    return "token file " + path_ + " (" + std::to_string(map_.count) + " tokens)";
  }

 private:
  std::string path_;
  std::uint64_t seed_;
  int seq_;
  MappedTokens map_;
};

}  // namespace

std::unique_ptr<DataSource> make_synthetic_source(std::uint64_t seed, int seq, int vocab) {
  return std::make_unique<Synthetic>(seed, seq, vocab);
}

std::unique_ptr<DataSource> make_token_file_source(const std::string& path, std::uint64_t seed,
                                                   int seq, int /*vocab: checked already*/) {
  return std::make_unique<TokenFile>(path, seed, seq);
}

void check_token_file(const std::string& path, int seq, int vocab) {
  const MappedTokens m = map_tokens(path, seq);
  std::size_t bad = m.count;
  for (std::size_t i = 0; i < m.count && bad == m.count; ++i)
    if (m.tokens[i] >= vocab) bad = i;
  const std::uint16_t token = bad < m.count ? m.tokens[bad] : 0;
  ::munmap(const_cast<std::uint16_t*>(m.tokens), m.bytes);
  if (bad < m.count)
    throw ConfigError("--data " + path + ": token " + std::to_string(token) + " at " +
                      std::to_string(bad) + " is not below --vocab " + std::to_string(vocab));
}

}  // namespace strata
