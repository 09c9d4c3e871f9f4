// Which thread is which: comm-stream workers set this, so that blocking calls and event waits on
// the compute thread (and only there) are recorded as compute idle time.
#pragma once
#include <string>

namespace strata {
extern thread_local bool t_on_comm_worker;
// The comm stream a worker thread runs (its name), null on the compute thread.
extern thread_local const std::string* t_stream_name;
}
