// The job-end note: the process that ends a job (mpi::abort_job, after the run file is written)
// tells the runner supervising its launcher (runner/supervisor.hpp) the exit code it ends it with.
// Under mpirun a non-zero end costs the job Open MPI 4.1's whole kill sequence, twice
// odls_base_sigkill_timeout (6 s here) even when every rank has already left; with the note the
// supervisor ends mpirun as soon as the ranks are gone and returns that code. The supervisor names
// the file in STRATA_JOB_END_NOTE; without it (mpirun or srun started by hand) nothing is written.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace strata {

inline constexpr const char* kJobEndNoteVariable = "STRATA_JOB_END_NOTE";

// Writes "CODE\n" to the named file: whole (a private name, then a hard link) and once, the first
// process's note staying (a second link fails), as the first process to end the job decides its
// code. True when a note stands: a supervisor will end the job.
inline bool write_job_end_note(int code) {
  const char* path = std::getenv(kJobEndNoteVariable);
  if (!path || !*path) return false;
  const std::string mine = std::string(path) + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(mine.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return false;  // no note (its folder gone): the launcher's own end
  const std::string text = std::to_string(code) + "\n";
  const bool whole = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  ::close(fd);
  if (whole) (void)::link(mine.c_str(), path);
  ::unlink(mine.c_str());
  return ::access(path, F_OK) == 0;
}

// The code a note at `path` holds, or none (no note yet).
inline std::optional<int> read_job_end_note(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char text[16] = {};
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  return std::atoi(text);
}

}  // namespace strata
