// Private: the collective faults of a fault build (faults.h), as a Transport decorator that
// TransportBackend puts around the vendor's transport. Only in a fault build.
#pragma once

#ifdef ACCELKIT_FAULTS

#include <accelkit/c10d/transport.h>

#include <memory>

namespace accelkit::c10d {

// `inner`, with the transport faults applied while ACCELKIT_FAULT names one of them. Every rank
// of a group takes the same decisions (they depend on the call and the fault only), so ranks
// stay in step and a fault shows as wrong data, never as a hang.
std::unique_ptr<Transport> with_faults(std::unique_ptr<Transport> inner);

}  // namespace accelkit::c10d

#endif  // ACCELKIT_FAULTS
