// StageModel: tensor-parallel shards are exact slices of the global initialisation, a chain of
// tp = 1 partitions (a pipeline) computes exactly what the whole model computes, bit for bit, and
// every recompute mode under tensor (and sequence) parallelism gives the gradients of no recompute
// with exactly the predicted activation memory and collective bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "model/model_passes.hpp"
#include "strata/stage_model.hpp"

namespace strata {
namespace {

// A boundary of an fp32 model as its floats (StageModel::input, output).
float* floats(BufferView v) {
  EXPECT_EQ(v.dtype, DType::f32);
  return static_cast<float*>(v.data);
}

ModelSpec tiny4() {
  ModelSpec s = model_preset("tiny");
  s.layers = 4;
  return s;
}

// A llama of 4 blocks whose 8 query heads share 4 K/V heads: tp 2 and 4 split both.
ModelSpec llama4() { return {"llama4", 4, 64, 8, 64, 256, Arch::llama, 4, 192, 10000}; }

// The global rows of each stacked block of a tensor cut by stacked_rows, from the spec: q | k | v
// heads (K/V fewer with grouped-query attention), a llama's gate | up.
std::vector<std::int64_t> stacked_blocks(const ModelSpec& spec, const TensorInfo& t) {
  const std::int64_t hs = spec.head_dim(), kv = spec.kv_head_count();
  if (t.name.find("qkv") != std::string::npos) return {spec.heads * hs, kv * hs, kv * hs};
  if (t.name.find("gate_up") != std::string::npos) return {spec.ffn, spec.ffn};
  return {};
}

TEST(StageModel, ShardsReassembleTheGlobalInit) {
  for (const ModelSpec& spec : {tiny4(), llama4()}) {
    SCOPED_TRACE(spec.preset);
    const ParamLayout layout(spec);
    std::vector<float> full(layout.total());
    init_params(layout, 7, 0, full);
    for (int tp : {2, 4}) {
      Partition part{0, spec.layers + 1, tp, 0, false};
      std::vector<std::vector<float>> local(tp);
      std::vector<LocalTensor> tensors;
      for (int r = 0; r < tp; ++r) {
        MemoryLedger mem;
        part.tp_rank = r;
        StageModel m(spec, 1, part, mem);
        local[r].resize(m.param_count());
        m.init_params(7, view(local[r].data(), local[r].size()));
        tensors = m.tensors();
      }
      for (const LocalTensor& lt : tensors) {
        const TensorInfo& t = layout.tensors()[lt.global];
        const float* g = full.data() + t.offset;
        for (int r = 0; r < tp; ++r) {
          const float* l = local[r].data() + lt.offset;
          for (std::size_t i = 0; i < lt.count; ++i) {
            std::size_t gi = i;  // global index of local element i
            if (lt.shard == ShardKind::rows) {
              gi = r * lt.count + i;
            } else if (lt.shard == ShardKind::stacked_rows) {
              // Block b's rank-r part sits after the parts of blocks before b.
              ASSERT_EQ(lt.stacked, stacked_blocks(spec, t)) << t.name;
              const std::size_t row = t.count / std::size_t(t.shape[0]);
              std::size_t local0 = 0, global0 = 0, b = 0;
              while (i >= local0 + std::size_t(lt.stacked[b]) * row / tp) {
                local0 += std::size_t(lt.stacked[b]) * row / tp;
                global0 += std::size_t(lt.stacked[b]) * row;
                ++b;
              }
              gi = global0 + r * (std::size_t(lt.stacked[b]) * row / tp) + (i - local0);
            } else if (lt.shard == ShardKind::columns) {
              const std::size_t ic = t.shape[1], icl = ic / tp;
              gi = (i / icl) * ic + r * icl + i % icl;
            }
            ASSERT_EQ(l[i], g[gi]) << t.name << " tp " << tp << " rank " << r << " element " << i;
          }
        }
      }
    }
  }
}

TEST(StageModel, TensorParallelCountsAndValidation) {
  const ModelSpec spec = tiny4();
  Partition all{0, spec.layers + 1, 4, 1, false};
  std::size_t sharded = 0, replicated = 0;
  for (const LocalTensor& t : StageModel::local_tensors(spec, all))
    (t.shard == ShardKind::replicated ? replicated : sharded) += t.count;
  EXPECT_EQ(sharded * 4 + replicated, std::size_t(spec.total_params()));
  EXPECT_THROW(validate_tensor_parallel(spec, 1, 3, false), ConfigError);  // 4 heads
  ModelSpec odd = spec;
  odd.vocab = 250;
  EXPECT_THROW(validate_tensor_parallel(odd, 1, 4, false), ConfigError);
  EXPECT_THROW(validate_tensor_parallel(spec, 1, 128, true), ConfigError);
  EXPECT_NO_THROW(validate_tensor_parallel(spec, 2, 4, true));
}

// A micro-batch of B sequences of fixed tokens and targets for `spec`.
struct Tokens {
  std::vector<std::int32_t> in, tg;
  MicroBatch mb;
  Tokens(const ModelSpec& spec, int B) : in(std::size_t(B) * spec.seq), tg(in.size()) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      in[i] = std::int32_t((i * 37 + 11) % spec.vocab);
      tg[i] = std::int32_t((i * 53 + 5) % spec.vocab);
    }
    mb = MicroBatch{in.data(), tg.data(), B, spec.seq};
  }
};

// The whole model at tp 1 without recompute (Context::model()'s StageModel), its passes over the
// flat `params` in ParamLayout order: the loss, and the gradients accumulated into `grads`.
double whole_model_pass(const ModelSpec& spec, int B, MemoryLedger& mem, std::vector<float>& params,
                        std::vector<float>& grads, const MicroBatch& mb, float scale) {
  StageModel model(spec, B, whole_model(spec), mem);
  const int slot = model.acquire_slot();
  model.forward(slot, view(params.data(), params.size()), mb, nullptr);
  model.backward(slot, view(params.data(), params.size()), view(grads.data(), grads.size()),
                 nullptr, scale);
  return model.loss_sum(slot);
}

// Two pipeline stages at tp = 1 equal the whole model: losses and every gradient, bitwise, in
// every recompute mode of the stages (against the whole model without recompute).
TEST(StageModel, PipelineChainEqualsTheWholeModel) {
  const ModelSpec spec = tiny4();
  const int B = 2, N = B * spec.seq, L = spec.layers;
  const Tokens tokens(spec, B);
  const MicroBatch& mb = tokens.mb;
  const float scale = 1.0f / N;

  MemoryLedger mem;
  const ParamLayout layout(spec);
  std::vector<float> params(layout.total()), grads(layout.total(), 0.0f);
  init_params(layout, 3, 0, params);
  const double loss = whole_model_pass(spec, B, mem, params, grads, mb, scale);

  for (Recompute r : {Recompute::none, Recompute::full, Recompute::selective}) {
    SCOPED_TRACE(recompute_name(r));
    StageModel first(spec, B, {0, 2, 1, 0, false}, mem, r);
    StageModel last(spec, B, {3, L + 1, 1, 0, false}, mem, r);
    std::vector<float> p0(first.param_count()), g0(first.param_count(), 0.0f);
    std::vector<float> p1(last.param_count()), g1(last.param_count(), 0.0f);
    first.init_params(3, view(p0.data(), p0.size()));
    last.init_params(3, view(p1.data(), p1.size()));
    const int s0 = first.acquire_slot(), s1 = last.acquire_slot();
    first.forward(s0, view(p0.data(), p0.size()), mb, nullptr);
    std::memcpy(floats(last.input(s1)), floats(first.output(s0)),
                first.boundary_count() * sizeof(float));
    last.forward(s1, view(p1.data(), p1.size()), mb, nullptr);
    EXPECT_EQ(last.loss_sum(s1), loss);
    last.backward(s1, view(p1.data(), p1.size()), view(g1.data(), g1.size()), nullptr, scale);
    std::memcpy(first.output_grad(), last.input_grad(s1), first.boundary_count() * sizeof(float));
    first.backward(s0, view(p0.data(), p0.size()), view(g0.data(), g0.size()), nullptr, scale);

    // The tied wte gradient is the sum of both stages' parts (the pipeline's exchange).
    for (const auto* stage : {&first, &last}) {
      const std::vector<float>& gl = stage == &first ? g0 : g1;
      for (const LocalTensor& lt : stage->tensors()) {
        const TensorInfo& t = layout.tensors()[lt.global];
        if (t.name.ends_with("wte")) continue;
        for (std::size_t i = 0; i < lt.count; ++i)
          ASSERT_EQ(gl[lt.offset + i], grads[t.offset + i]) << t.name << " element " << i;
      }
    }
    for (std::size_t i = 0; i < first.wte_count(); ++i)
      ASSERT_NEAR(g0[first.wte_offset() + i] + g1[last.wte_offset() + i], grads[i],
                  1e-9 + 1e-5 * std::fabs(grads[i]))
          << i;
  }
}

// A shard's initial values (the sharded engine initialises only the elements a rank owns): any
// range of a partition's local elements, at tp 1 and 2, sequence parallel or not, equals that
// range of the whole partition's initialisation, in fp32 and bf16.
TEST(StageModel, RangeInitialisationEqualsTheWholePartitions) {
  const ModelSpec spec = tiny4();
  const int L = spec.layers;
  for (const Partition& part : {Partition{0, L + 1, 1, 0, false}, Partition{0, L + 1, 2, 1, true},
                                Partition{2, L + 1, 2, 0, false}}) {
    std::vector<float> whole(StageModel::unit_ranges(spec, part).back().first +
                             StageModel::unit_ranges(spec, part).back().second);
    MemoryLedger mem;
    StageModel sm(spec, 1, part, mem);
    ASSERT_EQ(whole.size(), sm.param_count());
    sm.init_params(9, view(whole.data(), whole.size()));
    const std::size_t n = whole.size();
    for (const auto& [begin, count] : std::vector<std::pair<std::size_t, std::size_t>>{
             {0, n}, {1, n - 2}, {n / 3, n / 7 + 1}, {n - 5, 5}, {n / 2, 0}}) {
      std::vector<float> got(count, -1.0f);
      sm.init_params(9, begin, view(got.data(), count));
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(got[i], whole[begin + i]) << "tp " << part.tp_size << " element " << begin + i;
      std::vector<bf16> half(count);
      sm.init_params(9, begin, view(half.data(), count));
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(to_float(half[i]), to_float(to_bf16(whole[begin + i])));
    }
    std::vector<float> over(2);
    EXPECT_THROW(sm.init_params(9, n - 1, view(over.data(), 2)), Error);
  }
}

// One unit's pass at a time through UnitPtrs, driven by the caller (the sharded engine's and
// forward_backward's way), on views of ParamLayout's flat layout: the whole model at tp 1 gives
// the whole-buffer passes' loss and gradients bitwise, in every recompute mode.
TEST(StageModel, PerUnitPassesOnTheParamLayoutEqualTheWholeBuffer) {
  const ModelSpec spec = tiny4();
  const int B = 2, N = B * spec.seq, L = spec.layers;
  const Tokens tokens(spec, B);
  const float scale = 1.0f / N;
  MemoryLedger mem;
  const ParamLayout layout(spec);
  std::vector<float> params(layout.total()), want(layout.total(), 0.0f), got(layout.total(), 0.0f);
  init_params(layout, 5, 0, params);
  auto views = [&](std::vector<float>& flat) {
    UnitPtrs v;
    for (const UnitInfo& u : layout.units()) v.push_back(view(flat.data() + u.offset, u.count));
    return v;
  };
  const UnitPtrs p = views(params), g_got = views(got);
  const double loss = whole_model_pass(spec, B, mem, params, want, tokens.mb, scale);
  for (Recompute r : {Recompute::none, Recompute::full, Recompute::selective}) {
    SCOPED_TRACE(recompute_name(r));
    std::fill(got.begin(), got.end(), 0.0f);
    StageModel sm(spec, B, {0, L + 1, 1, 0, false}, mem, r);
    ASSERT_EQ(sm.param_count(), layout.total());
    for (int u = 0; u <= L + 1; ++u) ASSERT_EQ(sm.unit_range(u).first, layout.units()[u].offset);
    const int slot = sm.acquire_slot();
    for (int u = 0; u <= L + 1; ++u) sm.forward(slot, u, p, tokens.mb, nullptr);
    EXPECT_EQ(sm.loss_sum(slot), loss);
    for (int u = L + 1; u >= 0; --u) sm.backward(slot, u, p, g_got, nullptr, scale);
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
    sm.release_slot(slot);
  }
}

// Unit at a time (ZeRO-2 / FSDP on tp's dp axis): each unit's parameters and gradients in a buffer
// of its own, poisoned with NaN once released, give bitwise the whole-buffer passes' loss and
// gradients, on a whole model, a first stage and a head-only stage (its tied wte copy), in the
// documented order of acquires and releases.
TEST(StageModel, UnitAtATimePassesEqualTheWholeBuffer) {
  const ModelSpec spec = tiny4();
  const int B = 2, N = B * spec.seq, L = spec.layers;
  const Tokens tokens(spec, B);
  const MicroBatch& mb = tokens.mb;
  const float scale = 1.0f / N;
  for (Recompute r : {Recompute::none, Recompute::full}) {
    for (const auto& [first_unit, last_unit] : {std::pair{0, L + 1}, {0, 2}, {3, L + 1}}) {
      SCOPED_TRACE(std::to_string(first_unit) + "-" + std::to_string(last_unit));
      MemoryLedger mem;
      StageModel sm(spec, B, {first_unit, last_unit, 1, 0, false}, mem, r);
      const std::size_t n = sm.param_count();
      std::vector<float> p(n), g(n, 0.0f), dout(sm.boundary_count());
      for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = 1e-3f * float(i % 7);
      sm.init_params(5, view(p.data(), n));
      const auto ranges = StageModel::unit_ranges(spec, sm.partition());
      ASSERT_EQ(int(ranges.size()), last_unit - first_unit + 1);
      EXPECT_EQ(ranges.back().first + ranges.back().second, n);
      std::vector<float> in_act(sm.boundary_count());
      for (std::size_t i = 0; i < in_act.size(); ++i) in_act[i] = 0.01f * float(i % 13) - 0.05f;
      auto run = [&](bool units, std::vector<float>& grads, std::vector<std::string>& log) {
        std::map<int, std::vector<float>> held_p, held_g;
        auto access = [&](std::map<int, std::vector<float>>& held, std::vector<float>* source,
                          const char* what) {
          StageModel::UnitAccess a;
          a.acquire = [&, source, what](int u) {
            log.push_back(std::string("+") + what + std::to_string(u));
            const auto [off, cnt] = ranges[u - first_unit];
            auto& b = held[u];
            b.assign(source->begin() + off, source->begin() + off + cnt);
            return view(b.data(), b.size());
          };
          a.release = [&, source, what](int u) {
            log.push_back(std::string("-") + what + std::to_string(u));
            auto& b = held.at(u);
            if (what[0] == 'g')
              std::copy(b.begin(), b.end(), source->begin() + ranges[u - first_unit].first);
            std::fill(b.begin(), b.end(), std::nanf(""));
          };
          return a;
        };
        const int slot = sm.acquire_slot();
        if (!sm.has_embedding()) std::copy(in_act.begin(), in_act.end(), floats(sm.input(slot)));
        if (units)
          sm.forward(slot, access(held_p, &p, "p"), mb, nullptr);
        else
          sm.forward(slot, view(p.data(), n), mb, nullptr);
        const double loss = sm.loss_sum(slot);
        if (!sm.has_head()) std::copy(dout.begin(), dout.end(), sm.output_grad());
        if (units)
          sm.backward(slot, access(held_p, &p, "p"), access(held_g, &grads, "g"), nullptr, scale);
        else
          sm.backward(slot, view(p.data(), n), view(grads.data(), n), nullptr, scale);
        sm.release_slot(slot);
        return loss;
      };
      std::vector<float> g_units(n, 0.0f);
      std::vector<std::string> log_whole, log;
      const double whole = run(false, g, log_whole), unit = run(true, g_units, log);
      EXPECT_EQ(whole, unit);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(g[i], g_units[i]) << "element " << i;
      // The documented order: forward holds the embedding to the end; backward takes its
      // gradients (and parameters, with the head) first and releases them last.
      std::string order;
      for (const std::string& e : log) order += e + " ";
      if (first_unit == 0 && last_unit == L + 1)
        EXPECT_EQ(order,
                  "+p0 +p1 -p1 +p2 -p2 +p3 -p3 +p4 -p4 +p5 -p5 -p0 +p0 +g0 +p5 +g5 -p5 -g5 +p4 "
                  "+g4 -p4 -g4 +p3 +g3 -p3 -g3 +p2 +g2 -p2 -g2 +p1 +g1 -p1 -g1 -p0 -g0 ");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Recompute under tensor parallelism: tp ranks as threads of this process.

// One tp group member; the members meet at a barrier and read each other's buffers. Reductions sum
// in rank order on every rank, so every rank gets bitwise the same result.
class ThreadGroup final : public Group {
 public:
  struct Shared {
    explicit Shared(int n) : sync(n), posted(n), counts(n) {}
    std::barrier<> sync;
    std::vector<const float*> posted;
    std::vector<const std::vector<std::size_t>*> counts;  // all_to_allv: each rank's send counts
    // Point to point (ring attention): each (from, to, tag)'s messages in order, copied.
    std::mutex mu;
    std::condition_variable arrived;
    std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> mail;
  };
  ThreadGroup(Shared& shared, int rank, int size, CommLedger* ledger)
      : Group("tp", rank, size, ledger), shared_(shared) {}

 protected:
  void do_all_reduce(BufferView buf, Reduction r) override {
    float* p = static_cast<float*>(buf.data);
    const std::vector<float> mine(p, p + buf.count);
    exchange(mine.data(), [&] {
      for (std::size_t i = 0; i < buf.count; ++i) {
        float v = shared_.posted[0][i];
        for (int k = 1; k < size(); ++k)
          v = r == Reduction::sum ? v + shared_.posted[k][i] : std::max(v, shared_.posted[k][i]);
        p[i] = v;
      }
    });
  }
  void do_reduce_scatter(BufferView in, BufferView out) override {
    float* o = static_cast<float*>(out.data);
    exchange(static_cast<const float*>(in.data), [&] {
      for (std::size_t i = 0; i < out.count; ++i) {
        float v = 0;
        for (int k = 0; k < size(); ++k) v += shared_.posted[k][rank() * out.count + i];
        o[i] = v;
      }
    });
  }
  void do_all_gather(BufferView in, BufferView out) override {  // any dtype (moe's i32 counts)
    char* o = static_cast<char*>(out.data);
    exchange(static_cast<const float*>(in.data), [&] {
      for (int k = 0; k < size(); ++k)
        std::memcpy(o + std::size_t(k) * in.bytes(), shared_.posted[k], in.bytes());
    });
  }
  void do_broadcast(BufferView, int) override { FAIL() << "not used by the model"; }
  void do_reduce(BufferView, int) override { FAIL() << "not used by the model"; }
  void do_send(BufferView buf, int peer, int tag) override {
    const char* p = static_cast<const char*>(buf.data);
    std::lock_guard lock(shared_.mu);
    shared_.mail[{rank(), peer, tag}].emplace_back(p, p + buf.bytes());
    shared_.arrived.notify_all();
  }
  void do_recv(BufferView buf, int peer, int tag) override {
    std::unique_lock lock(shared_.mu);
    auto& box = shared_.mail[{peer, rank(), tag}];
    shared_.arrived.wait(lock, [&] { return !box.empty(); });
    ASSERT_EQ(box.front().size(), buf.bytes());
    std::memcpy(buf.data, box.front().data(), buf.bytes());
    box.pop_front();
  }
  void do_barrier() override { shared_.sync.arrive_and_wait(); }
  // all_to_allv (expert parallelism): from each rank k the block its send counts put here.
  void do_all_to_all(BufferView in, const std::vector<std::size_t>& send_counts, BufferView out,
                     const std::vector<std::size_t>& recv_counts) override {
    shared_.counts[rank()] = &send_counts;
    const std::size_t elem = dtype_size(in.dtype);
    exchange(static_cast<const float*>(in.data), [&] {
      std::size_t at = 0;
      for (int k = 0; k < size(); ++k) {
        const std::vector<std::size_t>& theirs = *shared_.counts[k];
        std::size_t from = 0;
        for (int j = 0; j < rank(); ++j) from += theirs[j];
        ASSERT_EQ(theirs[rank()], recv_counts[k]) << "from rank " << k;
        std::memcpy(static_cast<char*>(out.data) + at * elem,
                    reinterpret_cast<const char*>(shared_.posted[k]) + from * elem,
                    recv_counts[k] * elem);
        at += recv_counts[k];
      }
    });
  }

 private:
  template <class F>
  void exchange(const float* mine, F&& combine) {
    shared_.posted[rank()] = mine;
    shared_.sync.arrive_and_wait();
    combine();
    shared_.sync.arrive_and_wait();  // nobody's input goes away before all have read it
  }
  Shared& shared_;
};

// A spec whose attention probabilities weigh: T = 16 with C = 32, 4 heads.
ModelSpec att_heavy() { return {"att-heavy", 2, 32, 4, 16, 64}; }

struct RankResult {
  std::vector<double> losses;
  std::vector<float> grads;
  std::vector<float> input_grads;  // a partition without the embedding: d(input) of each slot
  std::uint64_t activation_peak = 0;
  std::map<CommOp, std::uint64_t> comm_bytes;  // as the ledger saw them
  std::map<CommOp, std::uint64_t> tp_bytes;    // as they went through the TensorParallelComm
};

// What a tp strategy's own TensorParallelComm would be: here the default, counting what passes
// through it, so the test knows every tensor-parallel collective goes through the interface.
class CountingTensorParallelComm final : public TensorParallelComm {
 public:
  CountingTensorParallelComm(Group& g, std::map<CommOp, std::uint64_t>& bytes)
      : sync_(g), bytes_(bytes) {}
  int rank() const override { return sync_.rank(); }
  int size() const override { return sync_.size(); }
  void all_reduce_sum(BufferView d) override {
    bytes_[CommOp::all_reduce] += d.bytes();
    sync_.all_reduce_sum(d);
  }
  void all_reduce_max(BufferView d) override {
    bytes_[CommOp::all_reduce] += d.bytes();
    sync_.all_reduce_max(d);
  }
  void all_gather(BufferView shard, BufferView full) override {
    bytes_[CommOp::all_gather] += full.bytes();
    sync_.all_gather(shard, full);
  }
  void reduce_scatter(BufferView full, BufferView shard) override {
    bytes_[CommOp::reduce_scatter] += full.bytes();
    sync_.reduce_scatter(full, shard);
  }

 private:
  SyncTensorParallelComm sync_;
  std::map<CommOp, std::uint64_t>& bytes_;
};

// One tp rank: two micro-batches in flight (two slots, as in a pipeline), forward both, then
// backward both, gradients accumulating.
// split: backwards that defer their weight gradients, both weight passes after both backwards.
RankResult run_rank(const ModelSpec& spec, int B, const Partition& part, Recompute r, Group& tp,
                    CommLedger& ledger, bool split = false) {
  MemoryLedger mem;
  StageModel m(spec, B, part, mem, r, DType::f32, DType::f32, split);
  EXPECT_EQ(m.recompute(), r);
  std::vector<float> params(m.param_count());
  RankResult out;
  out.grads.assign(m.param_count(), 0.0f);
  m.init_params(5, view(params.data(), params.size()));
  const int N = B * spec.seq;
  CountingTensorParallelComm tp_comm(tp, out.tp_bytes);
  std::vector<std::vector<std::int32_t>> in(2, std::vector<std::int32_t>(N)), tg = in;
  int slot[2];
  for (int k = 0; k < 2; ++k) {
    for (int i = 0; i < N; ++i) {
      in[k][i] = (i * 37 + 11 * k + 3) % spec.vocab;
      tg[k][i] = (i * 53 + 7 * k + 5) % spec.vocab;
    }
    slot[k] = m.acquire_slot();
    if (!m.has_embedding()) {  // a pipeline chunk's input: the same global rows in every mode
      const std::size_t n = m.boundary_count(),
                        row0 = part.sequence_parallel ? part.tp_rank * n : 0;
      for (std::size_t i = 0; i < n; ++i)
        floats(m.input(slot[k]))[i] = float(std::sin(0.37 * double(row0 + i) + k));
    }
    m.forward(slot[k], view(params.data(), params.size()),
              {in[k].data(), tg[k].data(), B, spec.seq}, &tp_comm);
    out.losses.push_back(m.loss_sum(slot[k]));
  }
  for (int k = 0; k < 2; ++k) {
    m.backward(slot[k], view(params.data(), params.size()),
               view(out.grads.data(), out.grads.size()), &tp_comm, 1.0f / float(2 * N));
    if (!m.has_embedding())
      out.input_grads.insert(out.input_grads.end(), m.input_grad(slot[k]),
                             m.input_grad(slot[k]) + m.boundary_count());
    if (split) {
      EXPECT_THROW(m.release_slot(slot[k]), Error);  // its weight gradients are still deferred
      continue;
    }
    m.release_slot(slot[k]);
  }
  if (split)
    for (int k = 0; k < 2; ++k) m.backward_weights(slot[k]), m.release_slot(slot[k]);
  out.activation_peak = mem.peak(MemTag::activations);
  for (const CommRecord& c : ledger.records()) out.comm_bytes[c.op] += c.bytes;
  return out;
}

// f(rank, its group member, its ledger) on n threads, one group of n ranks; the results by rank.
template <class F>
auto on_thread_ranks(int n, F&& f) {
  ThreadGroup::Shared shared(n);
  std::vector<decltype(f(0, std::declval<ThreadGroup&>(), std::declval<CommLedger&>()))> results(n);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank)
    threads.emplace_back([&, rank] {
      CommLedger ledger;
      ThreadGroup group(shared, rank, n, &ledger);
      results[rank] = f(rank, group, ledger);
    });
  for (auto& t : threads) t.join();
  return results;
}

std::vector<RankResult> run_tp(const ModelSpec& spec, int B, Partition part, Recompute r,
                               bool split = false) {
  return on_thread_ranks(part.tp_size, [&](int rank, ThreadGroup& group, CommLedger& ledger) {
    Partition p = part;
    p.tp_rank = rank;
    return run_rank(spec, B, p, r, group, ledger, split);
  });
}

CommOp op_named(const std::string& name) {
  for (int i = 0; i < kNumCommOps; ++i)
    if (name == kCommOpNames[i]) return CommOp(i);
  ADD_FAILURE() << name;
  return CommOp::barrier;
}

// Full and selective recompute under tp = 2 (with and without sequence parallelism, the whole
// model and a pipeline chunk without the embedding): the same losses and gradients as no
// recompute on every rank (room only for a reordered reduction; a stale recompute is O(1)), the
// activation peak equal to predict_activations() for two slots, less memory than none, and the
// ledger's collective bytes equal to tensor_parallel_collectives() of each unit's passes (a full
// recompute repeats the block's forward collectives).
TEST(StageModelRecompute, TensorParallelModesGiveTheSameGradientsAndPredictedMemory) {
  // att_heavy, and the same as a llama with grouped-query attention (2 K/V heads).
  for (const ModelSpec& spec :
       {att_heavy(), ModelSpec{"att-heavy-llama", 2, 32, 4, 16, 64, Arch::llama, 2, 96, 10000}}) {
    SCOPED_TRACE(spec.preset);
    const int B = 2, L = spec.layers;
    for (bool sp : {false, true}) {
      for (Partition part : {Partition{0, L + 1, 2, 0, sp}, Partition{2, L + 1, 2, 0, sp}}) {
        const std::vector<RankResult> ref = run_tp(spec, B, part, Recompute::none);
        for (Recompute r : {Recompute::none, Recompute::full, Recompute::selective}) {
          SCOPED_TRACE(std::string(sp ? "sp " : "") + "units " + std::to_string(part.first_unit) +
                       "-" + std::to_string(part.last_unit) + " " + recompute_name(r));
          const std::vector<RankResult> got = r == Recompute::none ? ref : run_tp(spec, B, part, r);
          const ActivationBytes predicted = predict_activations(spec, B, part, r);
          std::map<std::string, double> tp_bytes;
          for (int u = part.first_unit; u <= part.last_unit; ++u)
            for (bool backward : {false, true})
              for (const PassCollective& c :
                   tensor_parallel_collectives(spec, B, u, backward, 2, sp, 1, r, DType::f32))
                tp_bytes[op_name(c.op)] += c.bytes;
          for (int rank = 0; rank < 2; ++rank) {
            const RankResult& a = ref[rank];
            const RankResult& b = got[rank];
            EXPECT_EQ(b.activation_peak, predicted.total(2)) << "rank " << rank;
            if (r != Recompute::none) EXPECT_LT(b.activation_peak, a.activation_peak);
            for (const auto& [op, bytes] : tp_bytes)
              EXPECT_EQ(double(b.comm_bytes.at(op_named(op))), 2 * bytes) << op;
            // Every collective the ledger saw went through the TensorParallelComm the caller gave.
            EXPECT_EQ(b.tp_bytes, b.comm_bytes);
            ASSERT_EQ(a.losses.size(), b.losses.size());
            for (std::size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(b.losses[i], a.losses[i]);
            double max_g = 0;
            for (float g : a.grads) max_g = std::max(max_g, double(std::fabs(g)));
            ASSERT_GT(max_g, 1e-4);
            std::size_t not_bitwise = 0;
            for (std::size_t i = 0; i < a.grads.size(); ++i) {
              ASSERT_NEAR(b.grads[i], a.grads[i], 1e-6 * std::fabs(a.grads[i]) + 1e-9 * max_g)
                  << "rank " << rank << " element " << i;
              not_bitwise += b.grads[i] != a.grads[i];
            }
            EXPECT_EQ(not_bitwise, 0u) << "gradient elements not bit-for-bit equal (informative)";
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Expert parallelism: ep ranks as threads, each with its own micro-batch, its experts' rows
// exchanged through the ExpertParallelComm (all_to_allv).

// The default comm, counting the bytes each all_to_allv sends, as the ledger records them.
class CountingExpertParallelComm final : public ExpertParallelComm {
 public:
  CountingExpertParallelComm(Group& g, std::uint64_t& bytes) : sync_(g), bytes_(bytes) {}
  int rank() const override { return sync_.rank(); }
  int size() const override { return sync_.size(); }
  void all_gather(BufferView mine, BufferView all) override { sync_.all_gather(mine, all); }
  void all_to_allv(BufferView in, const std::vector<std::size_t>& send_counts, BufferView out,
                   const std::vector<std::size_t>& recv_counts) override {
    bytes_ += in.bytes();
    sync_.all_to_allv(in, send_counts, out, recv_counts);
  }

 private:
  SyncExpertParallelComm sync_;
  std::uint64_t& bytes_;
};

// Micro-batch `k` of B sequences: different tokens for each k.
struct RankTokens {
  std::vector<std::int32_t> in, tg;
  RankTokens(const ModelSpec& spec, int B, int k) : in(std::size_t(B) * spec.seq), tg(in.size()) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      in[i] = std::int32_t((i * 37 + 11 * k + 3) % spec.vocab);
      tg[i] = std::int32_t((i * 53 + 7 * k + 5) % spec.vocab);
    }
  }
  MicroBatch mb(int B, int T) const { return {in.data(), tg.data(), B, T}; }
};

struct EpResult {
  double loss = 0, aux = 0;
  std::vector<float> grads;
  std::vector<LocalTensor> tensors;
  std::uint64_t activation_peak = 0, exchanged = 0, ledger_all_to_all = 0;
};

// Micro-batch `k`'s forward and backward on the partition `part`, gradients scaled for the mean
// over `ranks` micro-batches.
EpResult run_ep_rank(const ModelSpec& spec, int B, const Partition& part, Recompute r, int k,
                     int ranks, Group* group, CommLedger* ledger) {
  MemoryLedger mem;
  StageModel m(spec, B, part, mem, r);
  EpResult out;
  CountingExpertParallelComm comm(*group, out.exchanged);
  if (part.ep_size > 1) m.set_expert_comm(&comm);
  std::vector<float> params(m.param_count());
  out.grads.assign(m.param_count(), 0.0f);
  m.init_params(5, view(params.data(), params.size()));
  const RankTokens tokens(spec, B, k);
  const int slot = m.acquire_slot();
  m.forward(slot, view(params.data(), params.size()), tokens.mb(B, spec.seq), nullptr);
  out.loss = m.loss_sum(slot);
  out.aux = m.aux_loss_sum(slot);
  m.backward(slot, view(params.data(), params.size()), view(out.grads.data(), out.grads.size()),
             nullptr, 1.0f / float(ranks * B * spec.seq));
  out.tensors = m.tensors();
  out.activation_peak = mem.peak(MemTag::activations);
  if (ledger)
    for (const CommRecord& c : ledger->records())
      if (c.op == CommOp::all_to_all) out.ledger_all_to_all += c.bytes;
  return out;
}

std::vector<EpResult> run_ep(const ModelSpec& spec, int B, int ep, Recompute r) {
  return on_thread_ranks(ep, [&](int rank, ThreadGroup& group, CommLedger& ledger) {
    Partition part = whole_model(spec);
    part.ep_size = ep, part.ep_rank = rank;
    return run_ep_rank(spec, B, part, r, rank, ep, &group, &ledger);
  });
}

// A split backward (zero-bubble pipelines) and its weight pass, after both micro-batches'
// backwards: bit for bit the losses, input gradients and parameter gradients of the unsplit
// backward (the same GEMMs, each weight gradient summed in the same micro-batch order), for GPT-2,
// a llama with grouped-query attention and a mixture of experts with a capacity and a shared
// expert, at tp 1 and 2 with and without sequence parallelism, the whole model and a chunk without
// the embedding; the activation peak is predict_activations' with the deferred d(output)s, more
// than the unsplit one's. Full recompute keeps no activations for a weight pass: refused.
TEST(StageModelSplitBackward, WeightPassGivesTheUnsplitGradientsAndPredictedMemory) {
  ModelSpec moe = model_preset("tiny-moe");
  moe.capacity_factor = 1.0, moe.shared_experts = 1;
  const ModelSpec llama{"att-heavy-llama", 2, 32, 4, 16, 64, Arch::llama, 2, 96, 10000};
  const int B = 2;
  for (const ModelSpec& spec : {att_heavy(), llama, moe}) {
    const int L = spec.layers, tps = spec.arch == Arch::moe ? 1 : 2;
    for (int tp = 1; tp <= tps; ++tp)
      for (bool sp : {false, true}) {
        if (sp && tp == 1) continue;
        for (Partition part : {Partition{0, L + 1, tp, 0, sp}, Partition{2, L + 1, tp, 0, sp}})
          for (Recompute r : {Recompute::none, Recompute::selective}) {
            SCOPED_TRACE(spec.preset + " tp " + std::to_string(tp) + (sp ? " sp" : "") + " units " +
                         std::to_string(part.first_unit) + "- " + recompute_name(r));
            const std::vector<RankResult> ref = run_tp(spec, B, part, r);
            const std::vector<RankResult> got = run_tp(spec, B, part, r, true);
            const ActivationBytes plain = predict_activations(spec, B, part, r),
                                  split = predict_activations(spec, B, part, r, DType::f32,
                                                              Device::cpu, true);
            EXPECT_GT(split.slot, plain.slot);
            EXPECT_EQ(split.scratch, plain.scratch);
            for (int rank = 0; rank < tp; ++rank) {
              EXPECT_EQ(ref[rank].activation_peak, plain.total(2));
              EXPECT_EQ(got[rank].activation_peak, split.total(2));
              EXPECT_EQ(got[rank].losses, ref[rank].losses);
              EXPECT_EQ(got[rank].input_grads, ref[rank].input_grads);
              ASSERT_EQ(got[rank].grads.size(), ref[rank].grads.size());
              std::size_t differ = 0;
              for (std::size_t i = 0; i < ref[rank].grads.size(); ++i)
                differ += got[rank].grads[i] != ref[rank].grads[i];
              EXPECT_EQ(differ, 0u) << "rank " << rank;
              EXPECT_GT(*std::max_element(ref[rank].grads.begin(), ref[rank].grads.end()), 1e-4);
            }
          }
      }
  }
  MemoryLedger mem;
  EXPECT_THROW(StageModel(att_heavy(), 1, whole_model(att_heavy()), mem, Recompute::full,
                          DType::f32, DType::f32, true),
               ConfigError);
  EXPECT_THROW(predict_activations(att_heavy(), 1, whole_model(att_heavy()), Recompute::full,
                                   DType::f32, Device::cpu, true),
               ConfigError);
}

// tiny-moe's experts over ep = 2 and 4 ranks (dropless; with a capacity and a shared expert; with
// recompute): each rank's loss and load-balancing loss are those of its micro-batch on one rank,
// its non-expert gradients that micro-batch's, and its experts' gradients the sum of every
// micro-batch's for those experts (their rows came from every rank); activations as predicted.
TEST(StageModelExpertParallel, RanksEqualOneRankOnEachMicroBatch) {
  ModelSpec capped = model_preset("tiny-moe");
  capped.capacity_factor = 1.0, capped.shared_experts = 1;
  for (const auto& [spec, ep, r] :
       {std::tuple{model_preset("tiny-moe"), 2, Recompute::none},
        std::tuple{model_preset("tiny-moe"), 4, Recompute::none},
        std::tuple{capped, 2, Recompute::none}, std::tuple{capped, 2, Recompute::full},
        std::tuple{model_preset("tiny-moe"), 4, Recompute::selective}}) {
    SCOPED_TRACE("ep " + std::to_string(ep) + " capacity " + std::to_string(spec.capacity_factor) +
                 " " + recompute_name(r));
    const int B = 2;
    const ParamLayout layout(spec);
    std::vector<EpResult> ref;
    for (int k = 0; k < ep; ++k) {  // micro-batch k alone on one rank
      ThreadGroup::Shared one(1);
      ThreadGroup group(one, 0, 1, nullptr);
      ref.push_back(
          run_ep_rank(spec, B, whole_model(spec), Recompute::none, k, ep, &group, nullptr));
      ref.back().tensors.clear();
    }
    const std::vector<EpResult> got = run_ep(spec, B, ep, r);
    double max_g = 0;
    for (const EpResult& x : ref)
      for (float g : x.grads) max_g = std::max(max_g, double(std::fabs(g)));
    ASSERT_GT(max_g, 1e-4);
    for (int rank = 0; rank < ep; ++rank) {
      const EpResult& mine = got[rank];
      EXPECT_NEAR(mine.loss, ref[rank].loss, 1e-6 * std::fabs(ref[rank].loss)) << rank;
      EXPECT_NEAR(mine.aux, ref[rank].aux, 1e-9 + 1e-6 * std::fabs(ref[rank].aux)) << rank;
      Partition part = whole_model(spec);
      part.ep_size = ep, part.ep_rank = rank;
      EXPECT_EQ(mine.activation_peak, predict_activations(spec, B, part, r).total(1)) << rank;
      EXPECT_GT(mine.exchanged, 0u);
      EXPECT_EQ(mine.exchanged, mine.ledger_all_to_all) << "every exchange went through the comm";
      std::size_t expert_elements = 0;
      for (const LocalTensor& lt : mine.tensors) {
        const TensorInfo& t = layout.tensors()[lt.global];
        const bool expert = lt.shard == ShardKind::experts;
        ASSERT_EQ(lt.count, expert ? t.count / ep : t.count) << t.name;
        expert_elements += expert ? lt.count : 0;
        for (std::size_t i = 0; i < lt.count; ++i) {
          const std::size_t g = t.offset + (expert ? rank * lt.count : 0) + i;
          double want = ref[rank].grads[g];
          if (expert) {
            want = 0;
            for (const EpResult& x : ref) want += x.grads[g];
          }
          ASSERT_NEAR(mine.grads[lt.offset + i], want, 1e-5 * std::fabs(want) + 1e-7 * max_g)
              << t.name << " element " << i << " on rank " << rank;
        }
      }
      EXPECT_EQ(expert_elements,
                std::size_t(spec.layers) * 3 * spec.experts * spec.ffn * spec.hidden / ep);
    }
  }
}

// Context parallelism: rank k of cp runs its share (cp_position) of the same micro-batch's
// sequences.
struct CpResult {
  double loss = 0, aux_loss = 0;  // aux_loss: a moe's load-balancing loss (its share)
  std::vector<float> grads;
  std::uint64_t activation_peak = 0, exchanged = 0;  // all_to_all, all_gather, send, recv bytes
};

CpResult run_cp_rank(const ModelSpec& spec, int B, const Partition& part, Recompute r,
                     ContextParallelComm* comm, CommLedger* ledger) {
  MemoryLedger mem;
  StageModel m(spec, B, part, mem, r);
  m.set_context_comm(comm);
  CpResult out;
  std::vector<float> params(m.param_count());
  out.grads.assign(m.param_count(), 0.0f);
  m.init_params(5, view(params.data(), params.size()));
  const RankTokens whole(spec, B, 0);
  const int T = spec.seq / part.cp_size;
  RankTokens mine(spec, B, 0);
  mine.in.clear(), mine.tg.clear();
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < T; ++i) {
      const int t = cp_position(spec.seq, part.cp_size, part.cp_rank, i);
      mine.in.push_back(whole.in[std::size_t(b) * spec.seq + t]);
      mine.tg.push_back(whole.tg[std::size_t(b) * spec.seq + t]);
    }
  const int slot = m.acquire_slot();
  m.forward(slot, view(params.data(), params.size()), mine.mb(B, T), nullptr);
  out.loss = m.loss_sum(slot);
  out.aux_loss = m.aux_loss_sum(slot);
  m.backward(slot, view(params.data(), params.size()), view(out.grads.data(), out.grads.size()),
             nullptr, 1.0f / float(B * spec.seq));
  out.activation_peak = mem.peak(MemTag::activations);
  if (ledger)
    for (const CommRecord& c : ledger->records())
      if (c.op == CommOp::all_to_all || c.op == CommOp::all_gather || c.op == CommOp::send ||
          c.op == CommOp::recv)
        out.exchanged += c.bytes;
  return out;
}

// GPT-2 (learned positions), a llama (rotary positions, grouped-query attention: 4 heads on 2
// K/V heads, which Ulysses exchanges unrepeated at cp 2 and at cp 4 each to the 2 ranks whose
// query heads use it; 6 heads on 3, which cp 2 neither divides nor is divided by: repeated to
// every query head) and a moe with a
// capacity that drops choices (each rank's chunks keep what the whole sequence keeps) over cp = 2
// and 4 thread ranks, Ulysses and ring attention (its passes on a comm stream), in every
// recompute mode: the ranks' losses (and load-balancing losses, and drops) sum to the one-rank
// ones of the whole sequences and their gradients to its gradients (the dp group's sum); each
// rank's activations are predict_activations' and the bytes it exchanged
// context_parallel_collectives'.
TEST(StageModelContextParallel, RanksTogetherEqualOneRankOnWholeSequences) {
  const ModelSpec llama{"att-heavy-llama", 2, 32, 4, 16, 64, Arch::llama, 2, 96, 10000};
  // 4 experts, top 2, 6 choices an expert and sequence (of 8 on average): drops in every one
  const ModelSpec moe{"att-heavy-moe", 2, 32, 4, 16, 64, Arch::moe, 2, 96, 10000, 4, 2, 0.75};
  const ModelSpec odd{"att-heavy-llama-3kv", 2, 48, 6, 16, 64, Arch::llama, 3, 96, 10000};
  const int B = 2;
  for (const ModelSpec& spec : {att_heavy(), llama, moe, odd})
    for (int cp : {2, 4})
      for (ContextAttention how : {ContextAttention::ulysses, ContextAttention::ring})
        for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
          if (spec.heads % cp != 0) continue;  // odd's 6 heads: cp 2 only
          SCOPED_TRACE(spec.preset + " cp " + std::to_string(cp) + " " +
                       context_attention_name(how) + " " + recompute_name(r));
          const std::int64_t dropped_before = moe_routing_counts().dropped;
          const CpResult ref = run_cp_rank(spec, B, whole_model(spec), r, nullptr, nullptr);
          const std::int64_t dropped = moe_routing_counts().dropped - dropped_before;
          EXPECT_EQ(dropped > 0, spec.arch == Arch::moe);
          const std::vector<CpResult> got = on_thread_ranks(cp, [&](int rank, ThreadGroup& group,
                                                                    CommLedger& ledger) {
            Partition part = whole_model(spec);
            part.cp_size = cp, part.cp_rank = rank, part.cp_attention = how;
            CommStream stream(ledger, "ring");
            SyncContextParallelComm comm(group, how == ContextAttention::ring ? &stream : nullptr);
            return run_cp_rank(spec, B, part, r, &comm, &ledger);
          });
          EXPECT_EQ(moe_routing_counts().dropped - dropped_before, 2 * dropped);
          double loss = 0, aux_loss = 0, most = 0;
          std::vector<double> sum(ref.grads.size(), 0.0);
          for (int rank = 0; rank < cp; ++rank) {
            loss += got[rank].loss;
            aux_loss += got[rank].aux_loss;
            for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += got[rank].grads[i];
            Partition part = whole_model(spec);
            part.cp_size = cp, part.cp_rank = rank, part.cp_attention = how;
            const Dims d(spec, B, part, Device::cpu);
            EXPECT_EQ(d.ulysses_kv, spec.kv_heads == 2 && how == ContextAttention::ulysses);
            EXPECT_EQ(d.kv_copies, d.ulysses_kv && cp == 4 ? 2u : 1u);
            EXPECT_EQ(got[rank].activation_peak, predict_activations(spec, B, part, r).total(1));
            double bytes = 0;
            for (int u = 1; u <= spec.layers; ++u)
              for (bool backward : {false, true})
                for (const PassCollective& c : context_parallel_collectives(
                         spec, B, u, backward, 1, cp, how, r, DType::f32, Device::cpu))
                  bytes += c.bytes;
            EXPECT_GT(bytes, 0.0);
            EXPECT_EQ(double(got[rank].exchanged), bytes) << rank;
          }
          EXPECT_NEAR(loss, ref.loss, 1e-6 * std::fabs(ref.loss));
          EXPECT_NEAR(aux_loss, ref.aux_loss, 1e-6 * std::fabs(ref.aux_loss));
          EXPECT_EQ(ref.aux_loss > 0, spec.arch == Arch::moe);
          for (float g : ref.grads) most = std::max(most, double(std::fabs(g)));
          ASSERT_GT(most, 1e-4);
          for (std::size_t i = 0; i < sum.size(); ++i)
            ASSERT_NEAR(sum[i], ref.grads[i], 1e-5 * std::fabs(ref.grads[i]) + 1e-6 * most)
                << "element " << i;
        }
}

TEST(StageModelContextParallel, ImpossibleSplitsAreRefused) {
  const ModelSpec tiny = model_preset("tiny");  // 4 heads, seq 64
  EXPECT_NO_THROW(validate_context_parallel(tiny, 1, 4));
  EXPECT_NO_THROW(validate_context_parallel(tiny, 2, 2));
  EXPECT_THROW(validate_context_parallel(tiny, 2, 4), ConfigError);   // 8 head groups of 4 heads
  EXPECT_THROW(validate_context_parallel(tiny, 1, 3), ConfigError);   // seq 64
  EXPECT_THROW(validate_context_parallel(tiny, 1, 64), ConfigError);  // 2 cp chunks of seq
  EXPECT_NO_THROW(validate_context_parallel(tiny, 2, 4, ContextAttention::ring));  // any heads
  EXPECT_THROW(validate_context_parallel(tiny, 1, 0), ConfigError);
  EXPECT_NO_THROW(
      validate_context_parallel(model_preset("tiny-moe"), 1, 2));  // per-sequence counts
  MemoryLedger mem;
  Partition part = whole_model(tiny);
  part.cp_size = 2, part.cp_rank = 2;
  EXPECT_THROW(StageModel(tiny, 1, part, mem), Error);
}

void exchange_permutations_are_inverse_pairs(const ModelSpec& spec, int cp) {
  SCOPED_TRACE(spec.preset + " cp " + std::to_string(cp));
  Partition part = whole_model(spec);
  part.cp_size = cp, part.cp_rank = 1;
  const Dims d(spec, 3, part, Device::cpu);
  EXPECT_EQ(d.ulysses_kv, spec.kv_heads > 0 && spec.kv_heads != spec.heads);
  const std::size_t r = d.kv_copies;  // each K/V head's copies sent
  EXPECT_EQ(cp_perm_rows(d, qkv_send) * cp_perm_cols(d, qkv_send),
            d.ulysses_kv ? d.N * (d.QKVl + 2 * d.KVl * (r - 1) * d.hs) : 3 * d.N * d.Cl);
  const std::vector<std::int32_t> perm = cp_permutations(d);
  auto at = [&](int which, std::size_t row) { return perm[cp_perm_offset(d, which) + row]; };
  if (r > 1) {  // qkv_send repeats each K/V row r times; dqkv_local gathers the r copies back
    const std::size_t local = d.N * (d.NHl + 2 * d.KVl);
    ASSERT_EQ(cp_perm_rows(d, dqkv_local), local * r);
    std::vector<std::size_t> sent(local, 0);
    for (std::size_t s = 0; s < cp_perm_rows(d, qkv_send); ++s) {
      const std::size_t from = std::size_t(at(qkv_send, s));
      ASSERT_LT(from, local);
      ++sent[from];
      bool back = false;
      for (std::size_t c = 0; c < r; ++c) back = back || at(dqkv_local, from * r + c) == int(s);
      EXPECT_TRUE(back) << "sent row " << s;
    }
    for (std::size_t row = 0; row < local; ++row)
      EXPECT_EQ(sent[row], row % (d.NHl + 2 * d.KVl) < d.NHl ? 1u : r) << "local row " << row;
  }
  for (auto [forward, inverse] :
       {std::pair{qkv_send, dqkv_local}, std::pair{qkv_full, dqkv_send},
        std::pair{out_send, dout_full}, std::pair{out_local, dout_send}}) {
    if (r > 1 && forward == qkv_send) continue;  // above
    const std::size_t n = cp_perm_rows(d, forward);
    ASSERT_EQ(n, cp_perm_rows(d, inverse));
    std::vector<int> seen(n, 0);
    for (std::size_t r = 0; r < n; ++r) {
      const std::size_t from = std::size_t(at(forward, r));
      ASSERT_LT(from, n);
      ++seen[from];
      EXPECT_EQ(std::size_t(at(inverse, from)), r);
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), std::ptrdiff_t(n));
  }
}

// Ulysses' row permutations: each a permutation, each backward one the inverse of its forward; a
// GQA llama whose K/V heads cp divides exchanges its projection's heads once (N x QKVl elements,
// not 3 N Cl); one with fewer K/V heads than cp sends each to the cp / KV ranks using it and sums
// its gradient's copies back.
TEST(StageModelContextParallel, ExchangePermutationsAreInversePairs) {
  ModelSpec gqa = model_preset("tiny-llama");
  gqa.heads = 8, gqa.kv_heads = 4;
  ModelSpec mqa = gqa;
  mqa.kv_heads = 1;
  for (const auto& [spec, cp] : {std::pair{model_preset("tiny"), 4}, std::pair{gqa, 2},
                                 std::pair{gqa, 8}, std::pair{mqa, 4}})
    exchange_permutations_are_inverse_pairs(spec, cp);
}

TEST(StageModelExpertParallel, ImpossibleSplitsAreRefused) {
  const ModelSpec moe = model_preset("tiny-moe");  // 4 experts
  EXPECT_NO_THROW(validate_expert_parallel(moe, 4));
  EXPECT_THROW(validate_expert_parallel(moe, 3), ConfigError);
  EXPECT_THROW(validate_expert_parallel(moe, 0), ConfigError);
  EXPECT_THROW(validate_expert_parallel(model_preset("tiny-llama"), 2), ConfigError);
  EXPECT_NO_THROW(validate_expert_parallel(model_preset("tiny"), 1));
  MemoryLedger mem;
  Partition part = whole_model(moe);
  part.ep_size = 2, part.ep_rank = 2;
  EXPECT_THROW(StageModel(moe, 1, part, mem), Error);
}

}  // namespace
}  // namespace strata
