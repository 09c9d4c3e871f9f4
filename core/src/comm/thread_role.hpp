// Which thread is which: comm-stream workers set this, so that blocking calls and event waits on
// the compute thread (and only there) are recorded as compute idle time.
#pragma once
#include <optional>
#include <string>
#include <utility>

#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {
extern thread_local bool t_on_comm_worker;
// The comm stream a worker thread runs (its name), null on the compute thread.
extern thread_local const std::string* t_stream_name;
// The interval [t0, t1) (now()'s clock) a transport timed its call on the device, set by the
// transport inside a Group call and taken by the recording wrapper; unset: the host's interval.
extern thread_local std::optional<std::pair<double, double>> t_device_interval;
}  // namespace strata
STRATA_EXPORT_END
