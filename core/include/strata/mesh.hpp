// strata SDK: the parallel mesh and its rank arithmetic, one definition for the core (which builds
// every communicator from it) and for predict() (which must know the same groups without any
// communicator), so no plugin re-derives where a rank sits.
#pragma once
#include <vector>

#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// dp x cp x tp x pp = world. Rank order: tp fastest, then cp, then dp, then pp (Megatron's order),
// so that tensor parallel peers are neighbours on a node. `nodes` may be virtual: node = rank /
// ranks_per_node. ep (expert parallelism) is carved out of dp, as torchtitan and Megatron-Core
// carve it: it divides dp, and each run of ep consecutive dp ranks is one expert-parallel group.
// cp (context parallelism) splits each sequence: the cp ranks of one dp index read the same
// sequences, each its own share of their tokens (cp_position).
struct MeshSpec {
  int dp = 1, tp = 1, pp = 1;
  int nodes = 1, ranks_per_node = 1;
  int ep = 1;
  int cp = 1;
  int world() const { return dp * cp * tp * pp; }
  // The ranks that hold the same parameters and reduce their gradients together: the dp group's
  // size (Megatron's data-parallel-with-context-parallel group).
  int replicas() const { return dp * cp; }
};

// Where one rank sits: its index on each axis and its node (ep: its index in its ep group).
struct MeshCoord {
  int rank = 0, dp = 0, tp = 0, pp = 0;
  int node = 0, local_rank = 0;
  int ep = 0;
  int cp = 0;
};

// Communicators a strategy can ask for. dp: the ranks holding the same parameters (every dp
// index, and with cp > 1 every cp index of each: gradients are reduced over both, as Megatron's
// dp-cp group); cp: the ranks splitting this rank's sequences, in cp order. dp_intra_node: the dp
// peers on this (virtual) node; dp_inter_node: the dp peers with the same position among their
// node's peers on every other node. ep: the dp peers of this rank's expert-parallel group (dp
// indices [e*ep, e*ep + ep), at this rank's cp index); ep_dp: the dp peers at the same place in
// every other ep group and, with cp > 1, every cp index of each (Megatron's expert-data-parallel
// group: the replicas of this rank's experts, whose gradients are reduced over both). There is
// deliberately no world communicator: a strategy talks on its own axes.
enum class Axis { dp, tp, pp, dp_intra_node, dp_inter_node, ep, ep_dp, cp };

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
                                     {Axis::ep_dp, "ep_dp"},
                                     {Axis::cp, "cp"}};

class Mesh {
 public:
  explicit Mesh(const MeshSpec& spec) : spec_(spec) {}
  const MeshSpec& spec() const { return spec_; }
  int world() const { return spec_.world(); }

  MeshCoord coord(int rank) const;
  int rank_of(int dp, int tp, int pp, int cp) const {
    return tp + spec_.tp * (cp + spec_.cp * (dp + spec_.dp * pp));
  }
  // The rank at the same dp, tp and cp place as `me` on pipeline stage `pp`.
  int rank_of(const MeshCoord& me, int pp) const { return rank_of(me.dp, me.tp, pp, me.cp); }
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
