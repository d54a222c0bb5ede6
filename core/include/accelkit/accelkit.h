// accelkit's C++ integration layer for a PrivateUse1 device: include this (or the per-concept
// headers) from any number of translation units. Including registers nothing; the extension's
// init calls accelkit::register_device once (<accelkit/register.h>).
//
//   runtime.h       the Runtime a vendor implements (its driver calls): a seam
//   register.h      register_device(runtime, origin), registration()
//   context.h       current device, device count, index checks
//   host_tensor.h   device <-> CPU tensors for kernels that compute on the host
//   generator.h     the Philox generator (16-byte state) and the device's default generators
//   philox.h        the counter-based stream every random kernel draws from
//   fallback.h      the boxed fallback, and ACCELKIT_FALLBACK for native kernels
//   python.h        bind_device(m): the bindings torch.<name> is built from
//   c10d/transport.h, c10d/backend.h  the collective library side (a seam, and its glue)
#pragma once

#include <accelkit/context.h>
#include <accelkit/fallback.h>
#include <accelkit/generator.h>
#include <accelkit/host_tensor.h>
#include <accelkit/philox.h>
#include <accelkit/register.h>
#include <accelkit/runtime.h>
