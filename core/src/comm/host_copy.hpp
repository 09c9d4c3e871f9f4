// Device <-> host copies (CPU offload) recorded in the comm ledger like collectives: op d2h or
// h2d, group "host" of size 1, the bytes copied. The copy blocks the calling thread; on the
// compute thread that interval is also compute idle time (a wait), so it counts as exposed comm,
// as a blocking collective there does: the transfer is on the step's critical path.
#pragma once
#include "strata/comm.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

inline constexpr const char* kHostGroupName = "host";

// copy_across(dst, src), recorded into `ledger` as `op` (CommOp::d2h or CommOp::h2d).
void recorded_host_copy(CommLedger& ledger, CommOp op, BufferView dst, BufferView src);

}  // namespace strata
STRATA_EXPORT_END
