// The comm layer without MPI: interval arithmetic for exposed comm, the ledger's size convention,
// stream ordering, event errors and wait accounting.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/host_copy.hpp"
#include "comm/idle_clock.hpp"
#include "comm/intervals.hpp"
#include "strata/comm.hpp"

using namespace strata;

TEST(Intervals, UnionMergesOverlapsAndDropsEmpty) {
  Intervals v{{3, 4}, {0, 1}, {0.5, 2}, {5, 5}, {1.5, 1.0}};
  Intervals u = interval_union(v);
  ASSERT_EQ(u.size(), 2u);
  EXPECT_DOUBLE_EQ(u[0].first, 0);
  EXPECT_DOUBLE_EQ(u[0].second, 2);
  EXPECT_DOUBLE_EQ(union_length(v), 3.0);
}

TEST(Intervals, IntersectionIsExposedTime) {
  // comm busy [0,4) and [6,8); compute idle [3,7): exposed = [3,4) + [6,7) = 2
  Intervals comm{{0, 4}, {6, 8}}, idle{{3, 7}};
  EXPECT_DOUBLE_EQ(intersection_length(comm, idle), 2.0);
  EXPECT_DOUBLE_EQ(intersection_length(comm, {}), 0.0);
  // Overlapping comm streams are not double counted.
  EXPECT_DOUBLE_EQ(intersection_length({{0, 4}, {1, 3}}, {{0, 10}}), 4.0);
}

TEST(BusFactor, MatchesNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::all_reduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::all_gather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::reduce_scatter, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::broadcast, 8), 1.0);
}

// A group whose transport does nothing: enough to exercise the recording wrapper. Tests override
// the one call they need.
class NullGroup : public Group {
 public:
  NullGroup(const char* name, int size, CommLedger* l) : Group(name, 0, size, l) {}

 protected:
  void do_all_reduce(BufferView, Reduction) override {}
  void do_reduce_scatter(BufferView, BufferView) override {}
  void do_all_gather(BufferView, BufferView) override {}
  void do_broadcast(BufferView, int) override {}
  void do_reduce(BufferView, int) override {}
  void do_send(BufferView, int, int) override {}
  void do_recv(BufferView, int, int) override {}
  void do_barrier() override {}
  void do_all_to_all(BufferView, const std::vector<std::size_t>&, BufferView,
                     const std::vector<std::size_t>&) override {}
};

class LoopbackGroup final : public NullGroup {  // an all-reduce takes 20 ms
 public:
  LoopbackGroup(int size, CommLedger* l) : NullGroup("test", size, l) {}

 protected:
  void do_all_reduce(BufferView, Reduction) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
};

// A device's idle clock whose marks are numbers and whose every interval between two marks is
// 1 ms of idle stream; it counts what resolve_idle_waits measures and releases.
class CountingClock final : public IdleClock {
 public:
  std::uint64_t mark() override { return ++marks; }
  double seconds_between(std::uint64_t, std::uint64_t) override { return ++measured, 1e-3; }
  void release(std::uint64_t) override { ++released; }
  std::uint64_t marks = 0;
  int measured = 0, released = 0;
};

// A wait on a device is resolved after the step's synchronisation; a ledger that goes before
// then takes its pending waits with it, and only the living ledger's wait is measured.
TEST(CommLedger, DestroyedLedgerDropsItsPendingDeviceWaits) {
  CountingClock clock;
  set_idle_clock(&clock);
  {
    CommLedger gone;
    end_wait(gone, begin_wait());
  }
  CommLedger kept;
  const WaitStart start = begin_wait();
  end_wait(kept, start);
  EXPECT_TRUE(kept.waits(-1).empty());  // pending until resolved
  resolve_idle_waits();
  set_idle_clock(nullptr);
  EXPECT_EQ(clock.measured, 1);
  EXPECT_EQ(clock.released, 2);
  ASSERT_EQ(kept.waits(-1).size(), 1u);
  EXPECT_LE(kept.waits(-1)[0].second - kept.waits(-1)[0].first, 1e-3 + 1e-12);
}

TEST(CommLedger, RecordsNcclTestsSizes) {
  CommLedger ledger;
  ledger.set_step(3);
  LoopbackGroup g(4, &ledger);
  std::vector<float> big(400), small(100);
  g.all_reduce(view(big.data(), 400));
  g.all_gather(view(small.data(), 100), view(big.data(), 400));      // output size
  g.reduce_scatter(view(big.data(), 400), view(small.data(), 100));  // input size
  g.broadcast(view(small.data(), 100), 0);
  auto r = ledger.records();
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].op, CommOp::all_reduce);
  EXPECT_EQ(r[0].bytes, 1600u);
  EXPECT_EQ(r[1].bytes, 1600u);
  EXPECT_EQ(r[2].bytes, 1600u);
  EXPECT_EQ(r[3].bytes, 400u);
  EXPECT_EQ(r[0].step, 3);
  EXPECT_EQ(r[0].group, "test");
  EXPECT_GE(r[0].seconds(), 0.015);
  EXPECT_NEAR(r[0].busbw(), r[0].algbw() * 1.5, 1e-6 * r[0].algbw());
  // Blocking calls on the compute thread are compute idle time.
  EXPECT_EQ(ledger.waits(3).size(), 4u);
  EXPECT_THROW(g.all_gather(view(small.data(), 100), view(big.data(), 300)), Error);
  std::vector<CommRecord> drained;
  Intervals waits;
  ledger.drain(&drained, &waits);
  EXPECT_EQ(drained.size(), 4u);
  EXPECT_EQ(waits.size(), 4u);
  EXPECT_TRUE(ledger.records().empty());
  EXPECT_TRUE(ledger.waits(3).empty());
}

// all_to_all(v) is recorded with the rank's send bytes (nccl-tests' alltoall size) and the bus
// factor (n-1)/n; its counts are checked before the transport is called; a group of one copies.
TEST(CommLedger, AllToAllRecordsItsSendBytesAndChecksItsCounts) {
  CommLedger ledger;
  NullGroup g("test", 4, &ledger);  // this rank is 0
  std::vector<float> in(400), out(400);
  g.all_to_all(view(in.data(), 400), view(out.data(), 400));
  g.all_to_allv(view(in.data(), 400), {5, 0, 7, 1}, view(out.data(), 400), {5, 3, 0, 9});
  const auto r = ledger.records();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].op, CommOp::all_to_all);
  EXPECT_EQ(r[0].bytes, 1600u);
  EXPECT_EQ(r[1].bytes, 13 * sizeof(float));
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::all_to_all, 4), 0.75);
  EXPECT_STREQ(op_name(CommOp::all_to_all), "all_to_all");
  const BufferView a = view(in.data(), 400), b = view(out.data(), 400);
  EXPECT_THROW(g.all_to_all(a, view(out.data(), 398)), Error);             // not a multiple of 4
  EXPECT_THROW(g.all_to_allv(a, {1, 1, 1}, b, {1, 1, 1, 1}), Error);       // a count per rank
  EXPECT_THROW(g.all_to_allv(a, {1, 1, 1, 1}, b, {2, 1, 1, 1}), Error);    // its own block differs
  EXPECT_THROW(g.all_to_allv(a, {1, 1, 1, 400}, b, {1, 1, 1, 1}), Error);  // beyond `in`
  EXPECT_THROW(g.all_to_allv(a, {4, 4, 4, 4}, view(in.data() + 8, 16), {4, 4, 4, 4}), Error);
  EXPECT_EQ(ledger.records().size(), 2u);  // nothing refused was recorded

  NullGroup one("one", 1, &ledger);
  std::vector<float> src = {1, 2, 3}, dst(3, 0.0f);
  one.all_to_all(view(src.data(), 3), view(dst.data(), 3));
  EXPECT_EQ(dst, src);
}

// CPU offload's copies are ledger calls: d2h / h2d on the group "host" of size 1 (busbw = algbw),
// the bytes copied, the data really copied, and (on the compute thread) compute idle time.
TEST(CommLedger, RecordsHostCopiesAsTransfers) {
  CommLedger ledger;
  ledger.set_step(2);
  std::vector<float> device(300, 1.5f), host(300, 0.0f);
  recorded_host_copy(ledger, CommOp::d2h, view(host.data(), 300), view(device.data(), 300));
  EXPECT_EQ(host[299], 1.5f);
  host[0] = -2.0f;
  recorded_host_copy(ledger, CommOp::h2d, view(device.data(), 300), view(host.data(), 300));
  EXPECT_EQ(device[0], -2.0f);
  const auto r = ledger.records();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].op, CommOp::d2h);
  EXPECT_EQ(r[1].op, CommOp::h2d);
  EXPECT_STREQ(op_name(r[0].op), "d2h");
  EXPECT_STREQ(op_name(r[1].op), "h2d");
  for (const CommRecord& c : r) {
    EXPECT_EQ(c.bytes, 1200u);
    EXPECT_EQ(c.group, "host");
    EXPECT_EQ(c.group_size, 1);
    EXPECT_EQ(c.step, 2);
    EXPECT_EQ(c.stream, "compute");
    EXPECT_DOUBLE_EQ(c.busbw(), c.algbw());
  }
  EXPECT_EQ(ledger.waits(2).size(), 2u);  // the copy blocks compute: exposed, like a collective
  EXPECT_TRUE(ledger.in_flight().empty());
  // A mismatched copy throws and leaves nothing in flight.
  EXPECT_THROW(
      recorded_host_copy(ledger, CommOp::d2h, view(host.data(), 200), view(device.data(), 300)),
      Error);
  EXPECT_TRUE(ledger.in_flight().empty());
}

// A transport error must not leave the call "in flight" (the watchdog would report a hang).
class FailingGroup final : public NullGroup {
 public:
  explicit FailingGroup(CommLedger* l) : NullGroup("failing", 2, l) {}

 protected:
  void do_all_reduce(BufferView, Reduction) override { throw Error("transport failed"); }
};

TEST(CommLedger, FailedCallIsNotLeftInFlight) {
  CommLedger ledger;
  FailingGroup g(&ledger);
  float x = 0;
  EXPECT_THROW(g.all_reduce(view(&x, 1)), Error);
  EXPECT_TRUE(ledger.in_flight().empty());
}

TEST(CommStream, RunsInOrderOffTheCallingThread) {
  CommLedger ledger;
  CommStream stream(ledger);
  std::vector<int> order;
  std::thread::id caller = std::this_thread::get_id(), worker;
  for (int i = 0; i < 50; ++i)
    stream.enqueue([&, i] {
      order.push_back(i);
      worker = std::this_thread::get_id();
    });
  stream.synchronize();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(worker, caller);
}

TEST(CommStream, CollectiveOnStreamIsCommButNotIdleUntilWaited) {
  CommLedger ledger;
  ledger.set_step(0);
  LoopbackGroup g(2, &ledger);
  CommStream stream(ledger);
  std::vector<float> buf(10);
  Event e = stream.all_reduce(g, view(buf.data(), 10));
  EXPECT_FALSE(e.done());
  e.wait();  // the compute thread idles here: recorded
  EXPECT_TRUE(e.done());
  ASSERT_EQ(ledger.records().size(), 1u);
  auto waits = ledger.waits(0);
  ASSERT_EQ(waits.size(), 1u);  // the wait, not the worker's call
  Intervals comm{{ledger.records()[0].t0, ledger.records()[0].t1}};
  EXPECT_GT(intersection_length(comm, waits), 0.0);
}

TEST(CommStream, ErrorsReachTheWaiter) {
  CommLedger ledger;
  CommStream stream(ledger);
  Event e = stream.enqueue([] { throw Error("boom"); });
  EXPECT_THROW(e.wait(), Error);
  Event ok = stream.enqueue([] {});  // the stream survives
  EXPECT_NO_THROW(ok.wait());
}

TEST(CommStream, WorkAfterAnEventOfAnotherStreamSeesItsResult) {
  CommLedger ledger;
  CommStream producer(ledger, "producer"), consumer(ledger, "consumer");
  std::atomic<int> value{0};
  int seen = -1;
  Event made = producer.enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    value = 42;
  });
  Event used = consumer.enqueue([&] { seen = value; }, made);
  EXPECT_FALSE(used.done());  // the caller was not blocked: the consumer stream waits
  used.wait();
  EXPECT_EQ(seen, 42);
}

TEST(CommStream, AFailedEventFailsTheWorkAfterIt) {
  CommLedger ledger;
  CommStream a(ledger, "a"), b(ledger, "b");
  Event bad = a.enqueue([] { throw Error("producer failed"); });
  bool ran = false;
  Event after = b.enqueue([&] { ran = true; }, bad);
  EXPECT_THROW(after.wait(), Error);
  EXPECT_FALSE(ran);
  EXPECT_NO_THROW(b.enqueue([] {}, Event{}).wait());  // a default Event: no dependency
}
