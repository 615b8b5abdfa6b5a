// The C++ half of libvramfit_alloc: throwing the exceptions that PyTorch's
// Python bindings turn into Python errors.
//
// CUDAPluggableAllocator does not check the pointer our allocation function
// returns, so a refused allocation must be reported by throwing. PyTorch's
// handlers (HANDLE_TH_ERRORS, translate_exception_to_python, the autograd
// engine) catch `python_error` by name and move its `type`, `value` and
// `traceback` into Python's error indicator, which is how a budget failure
// reaches Python as torch.OutOfMemoryError with our message. The struct
// below has the same name and the same leading members (after the vtable:
// three PyObject pointers, then the message) as PyTorch's, which is all those
// handlers read (torch/csrc/Exceptions.h); libstdc++ matches exception types
// across libraries by their mangled name.
//
// Without Python (no interpreter in the process) a std::bad_alloc subclass
// carrying the message is thrown instead, which PyTorch reports as a
// RuntimeError with the same text.

#include <exception>
#include <new>
#include <string>
#include <utility>

extern "C" {
typedef struct _object PyObject;
typedef int (*vramfit_gil_ensure_fn)(void);
typedef void (*vramfit_gil_release_fn)(int);
typedef void (*vramfit_decref_fn)(PyObject*);
}

namespace {
vramfit_gil_ensure_fn gil_ensure = nullptr;
vramfit_gil_release_fn gil_release = nullptr;
vramfit_decref_fn decref = nullptr;
}  // namespace

struct python_error : public std::exception {
  python_error(PyObject* t, PyObject* v, const char* m)
      : type(t), value(v), traceback(nullptr), message(m) {}
  python_error(python_error&& other) noexcept
      : type(other.type),
        value(other.value),
        traceback(other.traceback),
        message(std::move(other.message)) {
    other.type = nullptr;
    other.value = nullptr;
    other.traceback = nullptr;
  }
  python_error(const python_error&) = delete;
  python_error& operator=(const python_error&) = delete;
  ~python_error() override {
    if ((type || value || traceback) && gil_ensure && decref) {
      int state = gil_ensure();
      if (type) decref(type);
      if (value) decref(value);
      if (traceback) decref(traceback);
      gil_release(state);
    }
  }
  const char* what() const noexcept override { return message.c_str(); }

  PyObject* type;
  PyObject* value;
  PyObject* traceback;
  std::string message;
};

namespace vramfit {
struct allocator_error : public std::bad_alloc {
  explicit allocator_error(const char* m) : message(m) {}
  const char* what() const noexcept override { return message.c_str(); }
  std::string message;
};
}  // namespace vramfit

extern "C" void vramfit_raise_set_python_api(vramfit_gil_ensure_fn ensure,
                                             vramfit_gil_release_fn release,
                                             vramfit_decref_fn dec) {
  gil_ensure = ensure;
  gil_release = release;
  decref = dec;
}

// Throws a python_error holding `type` and `value` (references the exception
// takes over).
extern "C" void vramfit_raise_python(PyObject* type, PyObject* value,
                                     const char* message) {
  throw python_error(type, value, message);
}

extern "C" void vramfit_raise_plain(const char* message) {
  throw vramfit::allocator_error(message);
}
