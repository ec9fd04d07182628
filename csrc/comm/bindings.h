// Adds the communicator's Python classes and functions to the module stfast._C (see bindings.cpp).
#pragma once

#include <Python.h>

namespace stfast::comm {

// Returns 0, or -1 with a Python exception set.
int add_bindings(PyObject* module) noexcept;

}  // namespace stfast::comm
