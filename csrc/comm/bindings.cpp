// pybind11 face of the communicator (stfast._C): the Store bootstrap in every build (the CPU tests use it),
// NcclWork and NcclCommunicator only in builds with CUDA + NCCL (STFAST_WITH_NCCL).
// Store arguments are torch.distributed stores, converted by torch's own pybind11 type (shared internals).
#include "comm/bindings.h"

#include "comm/bootstrap.h"
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

#ifdef STFAST_WITH_NCCL
  using Work = std::shared_ptr<NcclWork>;
  py::class_<NcclWork, Work>(m, "NcclWork", "One enqueued NCCL operation.")
      .def("wait", &NcclWork::wait, "Make the current CUDA stream wait for the operation (no host sync).")
      .def("is_completed", &NcclWork::is_completed)
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
