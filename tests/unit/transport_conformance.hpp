// What the transport conformance tests (test_transport, test_nccl_standin) share: host buffers of a
// dtype chosen at run time filled from small integers (exact in every dtype, so the order in which
// a transport adds them cannot change a result), bit-for-bit comparison against MPI's result, the
// values and labels of the cases, and the main() of a GoogleTest MPI program in which only rank 0
// prints gtest's output, other ranks print their failures prefixed by their rank, and every rank
// exits non-zero when a test failed on any rank.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/mpi_transport.hpp"
#include "strata/comm.hpp"
#include "strata/types.hpp"

namespace conformance {

using strata::BufferView;
using strata::DType;

constexpr DType kDtypes[] = {DType::f32, DType::f64, DType::i32,
                             DType::i64, DType::u8,  DType::bf16};

// `count` elements of a dtype chosen at run time, in host memory, set from integers.
class Buf {
 public:
  Buf(DType t, std::size_t count) : t_(t), count_(count), data_(count * strata::dtype_size(t)) {}
  Buf(DType t, std::size_t count, const std::function<long long(std::size_t)>& value)
      : Buf(t, count) {
    for (std::size_t i = 0; i < count; ++i) set(i, value(i));
  }
  void set(std::size_t i, long long v) {
    switch (t_) {
      case DType::f32:
        return put(i, float(v));
      case DType::f64:
        return put(i, double(v));
      case DType::i32:
        return put(i, std::int32_t(v));
      case DType::i64:
        return put(i, std::int64_t(v));
      case DType::u8:
        return put(i, std::uint8_t(v));
      case DType::bf16:  // small integers stay exact in bf16 (8 significant bits) and in its sums
        return put(i, strata::to_bf16(float(v % 16)));
    }
  }
  std::string text(std::size_t i) const {  // element i, printed
    switch (t_) {
      case DType::f32:
        return std::to_string(get<float>(i));
      case DType::f64:
        return std::to_string(get<double>(i));
      case DType::i32:
        return std::to_string(get<std::int32_t>(i));
      case DType::i64:
        return std::to_string(get<std::int64_t>(i));
      case DType::u8:
        return std::to_string(int(get<std::uint8_t>(i)));
      case DType::bf16:
        return std::to_string(strata::to_float(get<strata::bf16>(i)));
    }
    return "?";
  }
  BufferView view(std::size_t offset = 0, std::size_t count = SIZE_MAX) {
    return {data_.data() + offset * esize(), count == SIZE_MAX ? count_ - offset : count, t_};
  }
  DType dtype() const { return t_; }
  std::size_t count() const { return count_; }
  std::size_t esize() const { return strata::dtype_size(t_); }
  const unsigned char* bytes() const { return data_.data(); }
  unsigned char* bytes() { return data_.data(); }

 private:
  template <class T>
  void put(std::size_t i, T v) {
    std::memcpy(data_.data() + i * sizeof(T), &v, sizeof(T));
  }
  template <class T>
  T get(std::size_t i) const {
    T v;
    std::memcpy(&v, data_.data() + i * sizeof(T), sizeof(T));
    return v;
  }
  DType t_;
  std::size_t count_;
  std::vector<unsigned char> data_;
};

// Bit-for-bit equality, reporting the first element that differs.
inline void expect_same(const Buf& got, const Buf& want, const std::string& what) {
  ASSERT_EQ(got.count(), want.count()) << what;
  const std::size_t es = got.esize();
  for (std::size_t i = 0; i < got.count(); ++i)
    if (std::memcmp(got.bytes() + i * es, want.bytes() + i * es, es) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << got.count() << " is " << got.text(i)
                    << ", MPI has " << want.text(i);
      return;
    }
}

inline int world_rank() { return strata::mpi::world_rank(); }
inline int world_size() { return strata::mpi::world_size(); }

// Values for sums (small, sign-mixed; u8 non-negative and at most 22, so 5 ranks' sum fits: Open
// MPI 4.1's AVX MPI_SUM saturates u8 where C wraps) and for max (spread out, so the maximum moves).
inline long long sum_value(DType t, int rank, std::size_t i, int salt) {
  const long long v = (long long)((i * 7 + std::size_t(rank) * 13 + std::size_t(salt)) % 23);
  return t == DType::u8 ? v : v - 11;
}
inline long long max_value(int rank, std::size_t i, int salt) {
  return (long long)((i * 31 + std::size_t(rank) * 17 + std::size_t(salt) * 5) % 101) - 50;
}

// An all_to_allv whose result every rank knows: rank a sends rank b a block of scale elements, or
// with `varying` scale x (0 to 3, by the pair: empty blocks included), element k of it
// a2a_value(a, b, k).
struct AllToAllCase {
  std::vector<std::size_t> send_counts, recv_counts;
  Buf in, want;
};
inline std::size_t a2a_count(int from, int to, std::size_t scale, bool varying) {
  return varying ? scale * std::size_t((from * 3 + to * 5 + 1) % 4) : scale;
}
inline long long a2a_value(int from, int to, std::size_t k) {
  return (long long)((std::size_t(from) * 7 + std::size_t(to) * 11 + k) % 23);
}
inline AllToAllCase all_to_all_case(DType t, int rank, int size, std::size_t scale, bool varying) {
  AllToAllCase c{{}, {}, Buf(t, 0), Buf(t, 0)};
  std::size_t sent = 0, received = 0;
  for (int p = 0; p < size; ++p) {
    sent += c.send_counts.emplace_back(a2a_count(rank, p, scale, varying));
    received += c.recv_counts.emplace_back(a2a_count(p, rank, scale, varying));
  }
  c.in = Buf(t, sent);
  c.want = Buf(t, received);
  std::size_t in_at = 0, want_at = 0;
  for (int p = 0; p < size; ++p) {
    for (std::size_t k = 0; k < c.send_counts[std::size_t(p)]; ++k)
      c.in.set(in_at++, a2a_value(rank, p, k));
    for (std::size_t k = 0; k < c.recv_counts[std::size_t(p)]; ++k)
      c.want.set(want_at++, a2a_value(p, rank, k));
  }
  return c;
}

inline std::string label(const char* op, DType t, std::size_t count, int extra = -1) {
  std::string s = std::string(op) + " " + dtype_name(t) + " x" + std::to_string(count);
  if (extra >= 0) s += " root " + std::to_string(extra);
  return s + " on " + std::to_string(world_size()) + " ranks";
}

// Ranks other than 0 print only their failures, prefixed by their rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

// The whole main(): MPI up, gtest set up per rank, run_tests(rank) (which builds the groups and
// returns RUN_ALL_TESTS()), the worst result over all ranks, MPI down.
inline int run_mpi_tests(int argc, char** argv, const std::function<int(int rank)>& run_tests) {
  try {
    strata::mpi::init(&argc, &argv);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int rc = 1;
  try {
    rc = run_tests(rank);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "rank %d: %s (%s)\n", rank, e.what(), e.hint().c_str());
    strata::mpi::abort_job(1);
  }
  int any = rc;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any != 0 && rc == 0) std::fprintf(stderr, "a test failed on another rank\n");
  strata::mpi::finalize();
  return any != 0 ? 1 : 0;
}

}  // namespace conformance
