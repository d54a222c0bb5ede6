// Private: fault injection for accelkit's own mutation tests (tests/catalogue/test_mutants.py,
// bench/mutants.py), which prove that the conformance suite catches realistic bugs of a port.
//
// Everything here exists only in a fault build: the layer compiled with -DACCELKIT_FAULTS
// (accelkit.core.library(defines=("ACCELKIT_FAULTS",)); the mock builds it with
// ACCELKIT_MOCK_FAULTS=1). The shipped build compiles every fault point out. In a fault build
// the fault in effect is the one the environment variable ACCELKIT_FAULT names, read at every
// fault point (never cached), so a test can switch faults between checks in one process; the
// c10d glue reads it when a collective is issued and carries it to the thread that runs it.
#pragma once

#ifdef ACCELKIT_FAULTS

#include <string>
#include <vector>

namespace accelkit::faults {

struct Fault {
  const char* name;
  const char* story;  // the bug, in one line
};

// Every fault this build has, in the order of the table in bench/README.md.
const std::vector<Fault>& all();

// ACCELKIT_FAULT as the calling thread sees it now ("" when unset).
std::string current();

// True when the fault in effect is `name`.
bool active(const char* name);

// Makes the calling thread see `fault` instead of ACCELKIT_FAULT while it lives (a collective
// runs on the glue's worker thread with the fault of its issue).
class Scope {
 public:
  explicit Scope(std::string fault);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::string fault_;
  const std::string* previous_;
};

}  // namespace accelkit::faults

#endif  // ACCELKIT_FAULTS
