// Private: the runtime faults of a fault build (faults.h), as a Runtime decorator that
// register_device puts around the vendor's runtime: the driver-level porting mistakes a
// conformance run in the default (host-accessible, synchronous) mode cannot see, which
// `accelkit doctor` must catch by probing the runtime itself.
#pragma once

#ifdef ACCELKIT_FAULTS

#include <accelkit/runtime.h>

namespace accelkit::faults {

// `inner`, with the runtime faults applied while ACCELKIT_FAULT names one of them; lives as
// long as the process, as the runtime it wraps.
Runtime& with_faults(Runtime& inner);

}  // namespace accelkit::faults

#endif  // ACCELKIT_FAULTS
