// The mesh's rank arithmetic (strata/mesh.hpp) against the definitions written out by brute force:
// every axis partitions the world into groups of the right size, a group's ranks share what they
// must share, and ranks sit in each group by their index on the axis.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "strata/mesh.hpp"

namespace {

using strata::Axis;
using strata::Mesh;
using strata::MeshSpec;

std::vector<MeshSpec> shapes() {
  std::vector<MeshSpec> v;
  for (int dp : {1, 2, 3, 4})
    for (int tp : {1, 2})
      for (int pp : {1, 2, 3})
        for (int cp : {1, 2})
          for (int rpn : {1, 2, 4, 6, 8}) {
            const int world = dp * cp * tp * pp;
            if (world % rpn != 0) continue;
            for (int ep = 1; ep <= dp; ++ep)
              if (dp % ep == 0) {
                v.push_back({dp, tp, pp, world / rpn, rpn});
                v.back().ep = ep;
                v.back().cp = cp;
              }
          }
  return v;
}

// Whether rank a and b belong to the same `axis` group, by the definitions.
bool same_group(const Mesh& m, Axis axis, int a, int b) {
  const auto x = m.coord(a), y = m.coord(b);
  const bool cp = x.cp == y.cp;
  switch (axis) {
    case Axis::tp:
      return x.dp == y.dp && x.pp == y.pp && cp;
    case Axis::pp:
      return x.dp == y.dp && x.tp == y.tp && cp;
    case Axis::dp:  // the parameters' replicas: every dp and cp index
      return x.tp == y.tp && x.pp == y.pp;
    case Axis::cp:
      return x.dp == y.dp && x.tp == y.tp && x.pp == y.pp;
    case Axis::dp_intra_node:
      return x.tp == y.tp && x.pp == y.pp && cp && x.node == y.node;
    case Axis::dp_inter_node:
      return x.tp == y.tp && x.pp == y.pp && cp &&
             m.index_in_group(Axis::dp_intra_node, a) == m.index_in_group(Axis::dp_intra_node, b);
    case Axis::ep:  // the same run of ep dp indices
      return x.tp == y.tp && x.pp == y.pp && cp && x.dp / m.spec().ep == y.dp / m.spec().ep;
    case Axis::ep_dp:  // the same place in their runs, every cp index
      return x.tp == y.tp && x.pp == y.pp && x.dp % m.spec().ep == y.dp % m.spec().ep;
  }
  return false;
}

TEST(Mesh, CoordinatesAndRanksAreInverse) {
  for (const MeshSpec& s : shapes()) {
    const Mesh m(s);
    for (int r = 0; r < m.world(); ++r) {
      const auto c = m.coord(r);
      EXPECT_EQ(m.rank_of(c.dp, c.tp, c.pp, c.cp), r);
      EXPECT_EQ(c.node, r / s.ranks_per_node);
      EXPECT_EQ(c.local_rank, r % s.ranks_per_node);
      EXPECT_EQ(c.tp, r % s.tp);  // tp fastest (Megatron's order), then cp
      EXPECT_EQ(c.cp, (r / s.tp) % s.cp);
      EXPECT_EQ(c.ep, m.index_in_group(Axis::ep, r));
    }
  }
}

TEST(Mesh, EveryAxisPartitionsTheWorldByItsDefinition) {
  for (const MeshSpec& s : shapes()) {
    const Mesh m(s);
    for (const auto& [axis, name] : strata::kAxes) {
      for (int r = 0; r < m.world(); ++r) {
        const std::vector<int> g = m.group(axis, r);
        std::set<int> members(g.begin(), g.end());
        ASSERT_EQ(members.size(), g.size());
        for (int o = 0; o < m.world(); ++o)
          EXPECT_EQ(members.count(o) == 1, same_group(m, axis, r, o))
              << "axis " << int(axis) << " rank " << r << " other " << o;
        EXPECT_EQ(g[m.index_in_group(axis, r)], r);
        for (int o : g) EXPECT_EQ(m.group(axis, o), g);  // every member sees the same group
      }
    }
  }
}

TEST(Mesh, GroupSizesAndOrder) {
  const Mesh m({4, 2, 3, 6, 4});  // 24 ranks, 4 per node: a node holds 2 dp peers of each tp rank
  const int r = m.rank_of(3, 1, 2, 0);
  EXPECT_EQ(m.group(Axis::tp, r).size(), 2u);
  EXPECT_EQ(m.group(Axis::pp, r).size(), 3u);
  EXPECT_EQ(m.group(Axis::dp, r), (std::vector<int>{17, 19, 21, 23}));
  EXPECT_EQ(m.index_in_group(Axis::dp, r), 3);
  EXPECT_EQ(m.group(Axis::dp_intra_node, r), (std::vector<int>{21, 23}));
  EXPECT_EQ(m.group(Axis::dp_inter_node, r), (std::vector<int>{19, 23}));
  EXPECT_EQ(m.index_in_group(Axis::dp_inter_node, r), 1);
}

// Expert parallelism carved out of dp: dp 8 in ep groups of 2 (dp indices 0-1, 2-3, ...); ep_dp
// holds the 4 ranks at the same place in each, the replicas of one rank's experts.
TEST(Mesh, ExpertParallelGroupsSplitDp) {
  strata::MeshSpec s{8, 2, 1, 2, 8};
  s.ep = 2;
  const Mesh m(s);
  const int r = m.rank_of(5, 1, 0, 0);  // rank 11
  EXPECT_EQ(m.coord(r).ep, 1);
  EXPECT_EQ(m.group(Axis::ep, r), (std::vector<int>{9, 11}));
  EXPECT_EQ(m.group(Axis::ep_dp, r), (std::vector<int>{3, 7, 11, 15}));
  EXPECT_EQ(m.index_in_group(Axis::ep_dp, r), 2);
  s.ep = 1;  // no expert parallelism: ep is the rank alone, ep_dp all of dp
  EXPECT_EQ(Mesh(s).group(Axis::ep, r), (std::vector<int>{r}));
  EXPECT_EQ(Mesh(s).group(Axis::ep_dp, r), Mesh(s).group(Axis::dp, r));
}

// Context parallelism: dp 2 x cp 2 x tp 2 (8 ranks). The cp group is the ranks of one dp and tp
// index (tp fastest, then cp); the dp group, which reduces the gradients, every dp and cp index.
TEST(Mesh, ContextParallelGroupsSplitSequences) {
  strata::MeshSpec s{2, 2, 1, 1, 8};
  s.cp = 2;
  const Mesh m(s);
  EXPECT_EQ(m.world(), 8);
  EXPECT_EQ(s.replicas(), 4);
  const int r = m.rank_of(1, 1, 0, 1);  // rank 7
  EXPECT_EQ(r, 7);
  EXPECT_EQ(m.group(Axis::cp, r), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group(Axis::tp, r), (std::vector<int>{6, 7}));
  EXPECT_EQ(m.group(Axis::dp, r), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(m.index_in_group(Axis::cp, r), 1);
  // ep 2 inside dp (one ep group): the token exchange stays on the rank's cp index, the experts'
  // replicas are its cp peers, which routed other tokens of the same sequences.
  s.ep = 2;
  const Mesh e(s);
  EXPECT_EQ(e.group(Axis::ep, r), (std::vector<int>{3, 7}));
  EXPECT_EQ(e.group(Axis::ep_dp, r), (std::vector<int>{5, 7}));
}

}  // namespace
