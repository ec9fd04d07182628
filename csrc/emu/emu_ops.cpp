// The emulated CUDA ops (namespace stfast_emu, CPU tensors): stfast's CUDA kernels and launch code run by
// the CUDA emulator (cuda_emu.h), for tests and sanitizer runs (tests/test_cuda_emulated.py). The schemas
// are stfast's (csrc/common/schemas.h) plus the emulated device's SM count where a launch reads it. A library of
// its own (stfast/_emu*.so), so that a sanitizer build of it can replace it in a test process.
#include <torch/library.h>

#include <string>

#include "../common/schemas.h"
#include "cuda_emu.h"

namespace stfast {
namespace emu {
namespace {

void set_schedule_op(const std::string& name) {
  if (name == "forward") set_schedule(Schedule::kForward);
  else if (name == "reverse") set_schedule(Schedule::kReverse);
  else if (name == "parallel") set_schedule(Schedule::kParallel);
  else TORCH_CHECK_VALUE(false, "stfast_emu.set_schedule: schedule must be forward, reverse or parallel, got ", name);
}

std::string schedule_op() { return schedule_name(schedule()); }

}  // namespace

TORCH_LIBRARY(stfast_emu, m) {
  m.def(schema::kGeoConvForward);
  m.def(STFAST_GEO_CONV_BACKWARD_SCHEMA(", int sm_count=132"));
  m.def(schema::kLstmForward);
  m.def(schema::kLstmBackward);
  // How a block's threads are run: forward / reverse (fibers in thread order / reverse order, deterministic)
  // or parallel (OS threads at a real barrier, for ThreadSanitizer); see cuda_emu.h.
  m.def("set_schedule(str schedule) -> ()", &set_schedule_op);
  m.def("schedule() -> str", &schedule_op);
}

}  // namespace emu
}  // namespace stfast
