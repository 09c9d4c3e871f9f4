#include "run/data.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <vector>

#include "strata/types.hpp"
#include "util/hash.hpp"

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

// llm.c's token files: a header of 256 int32, its first three the magic number, the version
// (the token width) and the token count.
constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::size_t kLlmcHeaderBytes = 256 * sizeof(std::int32_t);

// A token file read with pread(), not mapped: a file truncated or rewritten while the run reads
// it is an error naming --data (a run file that says so), where a mapping would end every rank
// with SIGBUS and no file.
class TokenFileReader {
 public:
  TokenFileReader(const std::string& path, int seq) : path_(path) {
    // O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused just below).
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) throw ConfigError("--data " + path + ": cannot open the file");
    try {
      struct stat st {};
      if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))
        throw ConfigError("--data " + path + ": not a regular file");
      layout(std::size_t(st.st_size), seq);
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  ~TokenFileReader() { ::close(fd_); }
  TokenFileReader(const TokenFileReader&) = delete;
  TokenFileReader& operator=(const TokenFileReader&) = delete;

  std::size_t count() const { return count_; }
  std::string format() const {
    return header_ ? "llm.c v" + std::to_string(width_ / 2) + ", uint" + std::to_string(8 * width_)
                   : "flat uint16";
  }

  // tokens [first, first + n) into out; Error when the file no longer holds them. uint16 tokens
  // are read into the front of `out` and widened in place from the back.
  void read(std::size_t first, std::size_t n, std::uint32_t* out) const {
    auto* bytes = reinterpret_cast<unsigned char*>(out);
    read_bytes(header_ + first * width_, n * width_, bytes, first, n);
    if (width_ == 4) return;
    for (std::size_t i = n; i-- > 0;) {
      std::uint16_t t;
      std::memcpy(&t, bytes + 2 * i, 2);
      out[i] = t;
    }
  }

 private:
  // The format from the file's size and first bytes.
  void layout(std::size_t bytes, int seq) {
    std::int32_t head[3] = {};
    if (bytes >= kLlmcHeaderBytes) read_bytes(0, sizeof head, head, 0, 0);
    if (head[0] == kLlmcMagic) {
      if (head[1] != 1 && head[1] != 2)
        throw ConfigError("--data " + path_ + ": llm.c token file of version " +
                          std::to_string(head[1]) + "; 1 (uint16 tokens) and 2 (uint32) are read");
      header_ = kLlmcHeaderBytes;
      width_ = head[1] == 1 ? 2 : 4;
      count_ = std::size_t(std::uint32_t(head[2]));
      if (bytes != header_ + count_ * width_)
        throw ConfigError("--data " + path_ + ": its llm.c header says " + std::to_string(count_) +
                          " tokens of " + std::to_string(width_) + " bytes, the file has " +
                          std::to_string(bytes) + " bytes");
    } else {
      count_ = bytes / 2;
      if (bytes % 2 != 0)
        throw ConfigError("--data " + path_ +
                          ": must be a flat file of uint16 tokens or an llm.c token file (it has " +
                          std::to_string(bytes) + " bytes)");
    }
    if (count_ < std::size_t(seq) + 2)
      throw ConfigError("--data " + path_ + ": has " + std::to_string(count_) +
                        " tokens; a sequence of " + std::to_string(seq) + " needs at least " +
                        std::to_string(std::int64_t(seq) + 2));
  }

  void read_bytes(std::size_t at, std::size_t want, void* to, std::size_t first,
                  std::size_t n) const {
    auto* dst = static_cast<char*>(to);
    std::size_t done = 0;
    while (done < want) {
      const ssize_t got = ::pread(fd_, dst + done, want - done, off_t(at + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw Error(
            "--data " + path_ + ": cannot read tokens " + std::to_string(first) + ".." +
                std::to_string(first + n) + " (" +
                (got < 0 ? std::string(std::strerror(errno)) : "the file ends before") +
                "; it had " + std::to_string(count_) + " tokens when the run started)",
            "the file changed during the run: leave a --data file alone while runs read it");
      done += std::size_t(got);
    }
  }

  std::string path_;
  int fd_ = -1;
  std::size_t header_ = 0, width_ = 2, count_ = 0;
};

// The contents were checked before the ranks started (check_token_file); each window is checked
// again as it is read, should the file have changed since.
class TokenFile final : public DataSource {
 public:
  TokenFile(const std::string& path, std::uint64_t seed, int seq, int vocab)
      : path_(path), seed_(seed), seq_(seq), vocab_(vocab), file_(path, seq) {}
  void fill(int step, std::int64_t sample, std::int32_t* inputs,
            std::int32_t* targets) const override {
    const std::size_t windows = file_.count() - std::size_t(seq_);
    const std::size_t start =
        hash4(seed_, 0xf11e, std::uint64_t(step), std::uint64_t(sample)) % windows;
    thread_local std::vector<std::uint32_t> window;  // [T + 1], kept: fill runs per sample
    window.resize(std::size_t(seq_) + 1);
    file_.read(start, window.size(), window.data());
    for (std::size_t t = 0; t < window.size(); ++t)
      if (window[t] >= std::uint32_t(vocab_))
        throw Error(
            "--data " + path_ + ": token " + std::to_string(window[t]) + " at " +
                std::to_string(start + t) + " is not below --vocab " + std::to_string(vocab_),
            "the file changed during the run: leave a --data file alone while runs read it");
    for (int t = 0; t < seq_; ++t) {
      inputs[t] = std::int32_t(window[t]);
      targets[t] = std::int32_t(window[t + 1]);
    }
  }
  std::string describe() const override {
    return "token file " + path_ + " (" + file_.format() + ", " + std::to_string(file_.count()) +
           " tokens)";
  }

 private:
  std::string path_;
  std::uint64_t seed_;
  int seq_, vocab_;
  TokenFileReader file_;
};

}  // namespace

std::unique_ptr<DataSource> make_synthetic_source(std::uint64_t seed, int seq, int vocab) {
  return std::make_unique<Synthetic>(seed, seq, vocab);
}

std::unique_ptr<DataSource> make_token_file_source(const std::string& path, std::uint64_t seed,
                                                   int seq, int vocab) {
  return std::make_unique<TokenFile>(path, seed, seq, vocab);
}

void check_token_file(const std::string& path, int seq, int vocab) {
  const TokenFileReader file(path, seq);
  std::vector<std::uint32_t> chunk(std::size_t(1) << 18);  // 1 MiB at a time
  for (std::size_t first = 0; first < file.count(); first += chunk.size()) {
    const std::size_t n = std::min(chunk.size(), file.count() - first);
    file.read(first, n, chunk.data());
    for (std::size_t i = 0; i < n; ++i)
      if (chunk[i] >= std::uint32_t(vocab))
        throw ConfigError("--data " + path + ": token " + std::to_string(chunk[i]) + " at " +
                          std::to_string(first + i) + " is not below --vocab " +
                          std::to_string(vocab));
  }
}

}  // namespace strata
