// TemporaryFile (temporary_file.hpp).
#include "results/temporary_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "strata/types.hpp"

namespace strata {

std::string hidden_beside(const std::string& target, const std::string& suffix) {
  const std::filesystem::path t(target);
  std::string name = ".";  // (GCC 12 warns, wrongly, on "." + a temporary string)
  name += t.filename().string();
  name += suffix;
  return (t.parent_path() / name).string();
}

TemporaryFile::TemporaryFile(const std::string& target) : target_(target) {
  std::random_device entropy;
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    char suffix[40];
    std::snprintf(suffix, sizeof suffix, ".tmp-%d-%08x", int(::getpid()), unsigned(entropy()));
    path_ = hidden_beside(target, suffix);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) throw Error("create '" + path_ + "': " + std::strerror(errno));
  }
  if (fd_ < 0) throw Error("create a temporary file beside '" + target + "': all names taken");
}

TemporaryFile::~TemporaryFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(path_.c_str());  // ours: created exclusively above
}

void TemporaryFile::close() {
  if (fd_ < 0) return;
  const bool synced = ::fsync(fd_) == 0;
  const int e = errno;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!synced || !closed)
    throw Error("write '" + path_ + "': " + std::strerror(synced ? errno : e));
}

bool TemporaryFile::commit(bool replace) {
  close();
  if (replace) {
    if (std::rename(path_.c_str(), target_.c_str()) != 0)
      throw Error("rename '" + path_ + "' failed: " + std::strerror(errno));
  } else {
    // Only if nothing has that name yet: link() fails with EEXIST where rename() replaces.
    if (::link(path_.c_str(), target_.c_str()) != 0) {
      if (errno == EEXIST) return false;
      throw Error("link '" + path_ + "' failed: " + std::strerror(errno));
    }
    ::unlink(path_.c_str());
  }
  committed_ = true;
  return true;
}

}  // namespace strata
