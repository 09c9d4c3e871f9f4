// strata SDK: the parallel mesh and its rank arithmetic, one definition for the core (which builds
// every communicator from it) and for predict() (which must know the same groups without any
// communicator), so no plugin re-derives where a rank sits.
#pragma once
#include <vector>

#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// dp x tp x pp = world. Rank order: tp fastest, then dp, then pp (Megatron's order), so that tensor
// parallel peers are neighbours on a node. `nodes` may be virtual: node = rank / ranks_per_node.
// ep (expert parallelism) is carved out of dp, as torchtitan and Megatron-Core carve it: it divides
// dp, and each run of ep consecutive dp ranks is one expert-parallel group.
struct MeshSpec {
  int dp = 1, tp = 1, pp = 1;
  int nodes = 1, ranks_per_node = 1;
  int ep = 1;
  int world() const { return dp * tp * pp; }
};

// Where one rank sits: its index on each axis and its node (ep: its index in its ep group).
struct MeshCoord {
  int rank = 0, dp = 0, tp = 0, pp = 0;
  int node = 0, local_rank = 0;
  int ep = 0;
};

// Communicators a strategy can ask for. dp_intra_node: the dp peers on this (virtual) node;
// dp_inter_node: the dp peers with the same position among their node's peers on every other
// node. ep: the dp peers of this rank's expert-parallel group (dp indices [e*ep, e*ep + ep));
// ep_dp: the dp peers at the same place in every other ep group (Megatron's expert-data-parallel
// group: the replicas of this rank's experts). There is deliberately no world communicator: a
// strategy talks on its own axes.
enum class Axis { dp, tp, pp, dp_intra_node, dp_inter_node, ep, ep_dp };

// Every axis and its name (the run file's and the trace's group names), in creation order.
struct AxisName {
  Axis axis;
  const char* name;
};
inline constexpr AxisName kAxes[] = {{Axis::dp, "dp"},
                                     {Axis::tp, "tp"},
                                     {Axis::pp, "pp"},
                                     {Axis::dp_intra_node, "dp_intra_node"},
                                     {Axis::dp_inter_node, "dp_inter_node"},
                                     {Axis::ep, "ep"},
                                     {Axis::ep_dp, "ep_dp"}};

class Mesh {
 public:
  explicit Mesh(const MeshSpec& spec) : spec_(spec) {}
  const MeshSpec& spec() const { return spec_; }
  int world() const { return spec_.world(); }

  MeshCoord coord(int rank) const;
  int rank_of(int dp, int tp, int pp) const { return tp + spec_.tp * (dp + spec_.dp * pp); }
  int node_of(int rank) const { return rank / spec_.ranks_per_node; }

  // The ranks of the `axis` group that holds `rank`, in the order of their rank in that group.
  std::vector<int> group(Axis axis, int rank) const;
  // `rank`'s rank in that group (its index in group(axis, rank)).
  int index_in_group(Axis axis, int rank) const;

 private:
  MeshSpec spec_;
};

inline MeshCoord mesh_coord(const MeshSpec& m, int rank) { return Mesh(m).coord(rank); }

}  // namespace strata
STRATA_EXPORT_END
