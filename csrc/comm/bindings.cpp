// pybind11 face of the communicator (stfast._C): the Store bootstrap and the fake-NCCL test hook of the
// group / abort / close state machine (_FakeComm, fake_comm.h) in every build (the CPU tests use them),
// NcclWork and NcclCommunicator only in builds with CUDA + NCCL (STFAST_WITH_NCCL).
// Store arguments are torch.distributed stores, converted by torch's own pybind11 type (shared internals).
#include "comm/bindings.h"

#include "comm/bootstrap.h"
#include "comm/fake_comm.h"
#ifdef STFAST_WITH_NCCL
#include "comm/nccl_communicator.h"
#endif

#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace stfast::comm {

namespace {

std::chrono::milliseconds to_ms(double timeout_s) {
  if (!(timeout_s > 0)) throw py::value_error("timeout must be > 0 s, got " + std::to_string(timeout_s));
  return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
}

#ifdef STFAST_WITH_NCCL
ReduceOp parse_op(const std::string& op) {
  if (op == "sum") return ReduceOp::Sum;
  if (op == "avg") return ReduceOp::Avg;
  throw py::value_error("op must be 'sum' or 'avg', got '" + op + "'");
}

// The communicator's destructor joins its watchdog thread, which may need the GIL to drop tensor
// references: never destroy it while holding the GIL.
struct DeleteWithoutGil {
  void operator()(NcclCommunicator* c) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      delete c;
    } else {
      delete c;
    }
  }
};
#endif

}  // namespace

// The test hook: CommCore over a fake NCCL (fake_comm.h).
static void add_fake_bindings(py::module_& m) {
  using nogil = py::call_guard<py::gil_scoped_release>;
  py::class_<FakeWork, std::shared_ptr<FakeWork>>(m, "_FakeWork", "Test hook: a work of _FakeComm.")
      .def("wait", &FakeWork::wait, nogil())
      .def("is_completed", &FakeWork::is_completed, nogil())
      .def("synchronize", &FakeWork::synchronize, nogil())
      .def("finish", &FakeWork::finish, "The fake GPU reaches the work's end event.")
      .def_property_readonly("phase", [](FakeWork& w) {
        switch (w.phase()) {
          case WorkBase::Phase::Queued: return "queued";
          case WorkBase::Phase::Launched: return "launched";
          default: return "cancelled";
        }
      })
      .def_property_readonly("recorded", &FakeWork::recorded)
      .def_property_readonly("blocked", &FakeWork::blocked)
      .def_property_readonly("name", &FakeWork::name)
      .def_property_readonly("seq", &FakeWork::seq);
  py::class_<FakeComm, std::shared_ptr<FakeComm>>(
      m, "_FakeComm", "Test hook: the communicator's state machine (CommCore) over a fake NCCL that records calls "
      "and breaches of NCCL's group / abort rules.")
      .def(py::init<double>(), py::arg("timeout_s") = 60.0)
      .def("op", &FakeComm::op, py::arg("name") = "all_reduce", py::arg("fail") = false,
           py::arg("tensors") = std::vector<at::Tensor>{}, nogil())
      .def("group_start", &FakeComm::group_start, nogil())
      .def("group_end", &FakeComm::group_end, nogil())
      .def("abort", &FakeComm::abort, py::arg("reason") = "aborted by the caller", nogil())
      .def("close", &FakeComm::close, nogil())
      .def("watchdog_tick", [](FakeComm& c) { return c.watchdog_tick().size(); }, nogil())
      .def("set_async", &FakeComm::set_async, py::arg("state"))
      .def_property_readonly("error", &FakeComm::error)
      .def_property_readonly("log", &FakeComm::log)
      .def_property_readonly("violations", &FakeComm::violations)
      .def_property_readonly("launched", &FakeComm::launched)
      .def_property_readonly("cancelled", &FakeComm::cancelled)
      .def_property_readonly("alive", &FakeComm::alive)
      .def_property_readonly("held_works", &FakeComm::held_works,
                             "Works the communicator holds (in flight, queued, or dropped by an abort and not yet "
                             "released).");
  m.def("_fake_nccl_group_depth", [] { return fake_nccl_thread.depth; },
        "Test hook: the fake NCCL's group depth of the calling thread.");
  m.def("_comm_group_depth", &CommCore::thread_group_depth,
        "The communicators' NCCL group depth of the calling thread (over all communicators).");
}

static void add_bindings_or_throw(PyObject* module) {
  py::module_ m = py::reinterpret_borrow<py::module_>(module);
  m.def(
      "_exchange_through_store",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, const std::string& key, const py::bytes& value,
         double timeout_s) {
        if (!store) throw py::type_error("store must be a torch.distributed Store, got None");
        std::string v = value;
        std::string out;
        {
          py::gil_scoped_release nogil;
          out = exchange_through_store(*store, rank, key, v, to_ms(timeout_s));
        }
        return py::bytes(out);
      },
      py::arg("store"), py::arg("rank"), py::arg("key"), py::arg("value"), py::arg("timeout_s"),
      "Communicator bootstrap: rank 0 publishes `value` under `key`, other ranks wait up to timeout_s and read it.");

  add_fake_bindings(m);

#ifdef STFAST_WITH_NCCL
  using Work = std::shared_ptr<NcclWork>;
  py::class_<NcclWork, Work>(m, "NcclWork", "One enqueued NCCL operation.")
      .def("wait", &NcclWork::wait, "Make the current CUDA stream wait for the operation (no host sync).")
      .def("is_completed", &NcclWork::is_completed, "True once finished (False while queued in an open group).")
      .def("synchronize", &NcclWork::synchronize, py::call_guard<py::gil_scoped_release>(),
           "Block the host until the operation finished (raises the communicator's error).")
      .def_property_readonly("name", &NcclWork::name)
      .def_property_readonly("seq", &NcclWork::seq);

  using Comm = NcclCommunicator;
  using nogil = py::call_guard<py::gil_scoped_release>;
  py::class_<Comm, std::shared_ptr<Comm>>(m, "NcclCommunicator", "NCCL communicator bootstrapped through a Store.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size, int device,
                       double timeout_s, const std::string& key) {
             if (!store) throw py::type_error("store must be a torch.distributed Store, got None");
             to_ms(timeout_s);
             py::gil_scoped_release nogil;
             return std::shared_ptr<Comm>(new Comm(store, rank, world_size, device, timeout_s, key),
                                          DeleteWithoutGil{});
           }),
           py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("device"), py::arg("timeout_s"),
           py::arg("key"))
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("world_size", &Comm::world_size)
      .def_property_readonly("device", &Comm::device)
      .def_property_readonly("timeout_s", &Comm::timeout_s)
      .def_property_readonly("error", &Comm::error)
      .def(
          "all_reduce", [](Comm& c, const at::Tensor& t, const std::string& op) { return c.all_reduce(t, parse_op(op)); },
          py::arg("tensor"), py::arg("op") = "sum", nogil())
      .def("broadcast", &Comm::broadcast, py::arg("tensor"), py::arg("root"), nogil())
      .def("all_gather", &Comm::all_gather, py::arg("output"), py::arg("input"), nogil())
      .def(
          "reduce_scatter",
          [](Comm& c, const at::Tensor& out, const at::Tensor& in, const std::string& op) {
            return c.reduce_scatter(out, in, parse_op(op));
          },
          py::arg("output"), py::arg("input"), py::arg("op") = "sum", nogil())
      .def("send", &Comm::send, py::arg("tensor"), py::arg("peer"), nogil())
      .def("recv", &Comm::recv, py::arg("tensor"), py::arg("peer"), nogil())
      .def("group_start", &Comm::group_start, nogil())
      .def("group_end", &Comm::group_end, nogil())
      .def("abort", &Comm::abort, py::arg("reason") = "aborted by the caller", nogil())
      .def("close", &Comm::close, nogil())
      .def_static("nccl_version", &Comm::nccl_version);
#endif
}

int add_bindings(PyObject* module) noexcept {
  try {
    add_bindings_or_throw(module);
    return 0;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ImportError, e.what());
  }
  return -1;
}

}  // namespace stfast::comm
