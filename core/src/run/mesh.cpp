#include "strata/mesh.hpp"

#include <algorithm>

namespace strata {

MeshCoord Mesh::coord(int rank) const {
  MeshCoord c;
  c.rank = rank;
  c.tp = rank % spec_.tp;
  c.cp = (rank / spec_.tp) % spec_.cp;
  c.dp = (rank / (spec_.tp * spec_.cp)) % spec_.dp;
  c.pp = rank / (spec_.tp * spec_.cp * spec_.dp);
  c.node = node_of(rank);
  c.local_rank = rank % spec_.ranks_per_node;
  c.ep = c.dp % spec_.ep;
  return c;
}

std::vector<int> Mesh::group(Axis axis, int rank) const {
  const MeshCoord c = coord(rank);
  std::vector<int> ranks;  // no group is larger than tp, pp or the replicas (dp x cp)
  ranks.reserve(std::size_t(std::max({spec_.tp, spec_.pp, spec_.replicas()})));
  switch (axis) {
    case Axis::tp:
      for (int t = 0; t < spec_.tp; ++t) ranks.push_back(rank_of(c.dp, t, c.pp, c.cp));
      break;
    case Axis::pp:
      for (int p = 0; p < spec_.pp; ++p) ranks.push_back(rank_of(c.dp, c.tp, p, c.cp));
      break;
    case Axis::dp:  // every dp index and, with cp > 1, every cp index of each
      for (int d = 0; d < spec_.dp; ++d)
        for (int k = 0; k < spec_.cp; ++k) ranks.push_back(rank_of(d, c.tp, c.pp, k));
      break;
    case Axis::cp:
      for (int k = 0; k < spec_.cp; ++k) ranks.push_back(rank_of(c.dp, c.tp, c.pp, k));
      break;
    case Axis::dp_intra_node:  // dp peers on this node, by dp index
      for (int d = 0; d < spec_.dp; ++d)
        if (node_of(rank_of(d, c.tp, c.pp, c.cp)) == c.node)
          ranks.push_back(rank_of(d, c.tp, c.pp, c.cp));
      break;
    case Axis::dp_inter_node: {  // dp peers at the same position among their node's peers
      const int position = index_in_group(Axis::dp_intra_node, rank);
      for (int n = 0; n < spec_.nodes; ++n) {
        int seen = 0;
        for (int d = 0; d < spec_.dp; ++d) {
          const int r = rank_of(d, c.tp, c.pp, c.cp);
          if (node_of(r) == n && seen++ == position) ranks.push_back(r);
        }
      }
      break;
    }
    case Axis::ep:  // the run of ep dp indices holding this one
      for (int d = c.dp - c.ep; d < c.dp - c.ep + spec_.ep; ++d)
        ranks.push_back(rank_of(d, c.tp, c.pp, c.cp));
      break;
    case Axis::ep_dp:  // the same place in every ep group and, with cp > 1, every cp index of each
      for (int d = c.ep; d < spec_.dp; d += spec_.ep)
        for (int k = 0; k < spec_.cp; ++k) ranks.push_back(rank_of(d, c.tp, c.pp, k));
      break;
  }
  return ranks;
}

int Mesh::index_in_group(Axis axis, int rank) const {
  const std::vector<int> ranks = group(axis, rank);
  return int(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

}  // namespace strata
