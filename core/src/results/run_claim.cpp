// The run file's claim (run_claim.hpp). flock() rather than an exclusive create alone: a lock
// goes with its process, so a run killed with SIGKILL never leaves a claim that refuses the next.
#include "results/run_claim.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "results/temporary_file.hpp"
#include "strata/types.hpp"

namespace strata {
namespace {

constexpr const char* kTokenVariable = "STRATA_RUN_CLAIM";

std::string claim_path(const std::string& run_file) { return hidden_beside(run_file, ".claim"); }

// The claim file's one line: "pid PID on HOST token TOKEN".
std::string read_claim(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string line(buf, n > 0 ? std::size_t(n) : 0);
  return line.substr(0, line.find('\n'));
}

std::string token_of(const std::string& claim) {
  const auto at = claim.rfind(" token ");
  return at == std::string::npos ? "" : claim.substr(at + 7);
}

std::string holder_of(const std::string& claim) {
  const auto at = claim.rfind(" token ");
  return claim.empty() ? "pid unknown" : claim.substr(0, at);
}

std::string new_token() {
  std::random_device entropy;
  char token[24];
  std::snprintf(token, sizeof token, "%08x%08x", unsigned(entropy()), unsigned(entropy()));
  return token;
}

void write_claim(int fd) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string token = new_token();
  const std::string line =
      "pid " + std::to_string(::getpid()) + " on " + host + " token " + token + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) != ssize_t(line.size()))
    throw Error(std::string("write the run's claim: ") + std::strerror(errno));
  ::setenv(kTokenVariable, token.c_str(), 1);  // the relaunched ranks' proof that it is theirs
}

bool same_file(int fd, const std::string& path) {
  struct stat held {};
  struct stat named {};
  return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 &&
         held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}

// Locks the claim file: true once held by this process, false when the claim is this job's
// already (held by the launcher that started this rank). Throws when another run holds it.
bool lock_claim(const std::string& path, const std::string& run_file, const std::string& run_id) {
  const std::string what = "--run-id " + run_id + ": ";
  for (int attempt = 0; attempt < 16; ++attempt) {
    // The launcher holds it while it supervises mpirun or srun: no rank needs the descriptor.
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) throw ConfigError(what + "cannot create " + path + ": " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      const std::string claim = read_claim(fd);
      ::close(fd);
      const char* ours = std::getenv(kTokenVariable);
      if (e == EWOULDBLOCK && ours && *ours && token_of(claim) == ours) return false;
      if (e == EWOULDBLOCK)
        throw ConfigError(what + "another run (" + holder_of(claim) + ") is writing " + run_file +
                          " now; choose another --run-id, or wait for it and pass --overwrite");
      if (e == ENOLCK || e == ENOSYS || e == EOPNOTSUPP) {  // e.g. Lustre mounted without flock
        std::fprintf(stderr,
                     "runner: note: %s cannot be locked here (%s): concurrent runs of "
                     "--run-id %s are not detected\n",
                     path.c_str(), std::strerror(e), run_id.c_str());
        return false;
      }
      throw ConfigError(what + "cannot lock " + path + ": " + std::strerror(e));
    }
    if (same_file(fd, path)) {
      write_claim(fd);
      return true;  // fd stays open, and locked, for the life of the process
    }
    ::close(fd);  // its holder removed it between our open and our lock: claim the new one
  }
  throw ConfigError(what + "could not claim " + path + " (it keeps being replaced)");
}

}  // namespace

void claim_run_file(const std::string& run_file, const std::string& run_id, bool overwrite) {
  const bool claimed_here = lock_claim(claim_path(run_file), run_file, run_id);
  // A relaunched rank 0: its launcher checked, under the same claim.
  if (!claimed_here && std::getenv(kTokenVariable)) return;
  std::error_code ec;
  if (!overwrite && std::filesystem::exists(std::filesystem::symlink_status(run_file, ec))) {
    release_run_file_claim(run_file);  // ours, still locked: no other run can be in between
    throw ConfigError("--run-id " + run_id + ": " + run_file +
                      " exists (an earlier run's); --overwrite replaces it, or choose another "
                      "--run-id");
  }
}

void release_run_file_claim(const std::string& run_file) {
  const std::string path = claim_path(run_file);
  const char* ours = std::getenv(kTokenVariable);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 || !ours) {
    if (fd >= 0) ::close(fd);
    return;
  }
  if (token_of(read_claim(fd)) == ours) ::unlink(path.c_str());
  ::close(fd);
}

}  // namespace strata
