// A file written under a hidden temporary name and put in place whole (the run file, the --trace
// timeline, a machine profile), so that a reader never sees half of one.
#pragma once

#include <string>

namespace strata {

// ".NAME" + suffix in the directory of `target` (NAME its file name): the hidden files kept beside
// a run file, which directory scans (the archive tools' *.h5) skip.
std::string hidden_beside(const std::string& target, const std::string& suffix);

// ".NAME.tmp-PID-RANDOM" beside `target`, created exclusively (O_EXCL): a stale temporary file
// (kill -9 leaves them, and a later process may have the same pid) is never taken, truncated or
// deleted. The file is removed when this object goes unless commit() moved it into place.
class TemporaryFile {
 public:
  explicit TemporaryFile(const std::string& target);  // Error when it cannot be created
  ~TemporaryFile();
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }  // open for writing until close()
  void close();                   // fsync and close; Error on failure
  // Moves the file to its target: replacing a file there (rename), or only where none is
  // (link: false, and the file stays temporary, when one is). Error on any other failure.
  bool commit(bool replace);

 private:
  std::string target_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace strata
