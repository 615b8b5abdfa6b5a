//! Reporting a refused request to PyTorch: by throwing (see `raise.cpp`).
//!
//! With a Python interpreter in the process, the exception carries a Python
//! exception object built here: `torch.OutOfMemoryError` for out-of-memory
//! (budget or device), `RuntimeError` for the rest. The interpreter's
//! functions are looked up in the process (`dlsym`), so the library links
//! against no Python.

use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::OnceLock;

type PyObject = c_void;

unsafe extern "C-unwind" {
    fn vramfit_raise_python(ty: *mut PyObject, value: *mut PyObject, message: *const c_char);
    fn vramfit_raise_plain(message: *const c_char);
}

unsafe extern "C" {
    fn vramfit_raise_set_python_api(
        ensure: unsafe extern "C" fn() -> c_int,
        release: unsafe extern "C" fn(c_int),
        decref: unsafe extern "C" fn(*mut PyObject),
    );
}

type IntFn = unsafe extern "C" fn() -> c_int;
type ReleaseFn = unsafe extern "C" fn(c_int);
type ImportFn = unsafe extern "C" fn(*const c_char) -> *mut PyObject;
type GetAttrFn = unsafe extern "C" fn(*mut PyObject, *const c_char) -> *mut PyObject;
type StringFn = unsafe extern "C" fn(*const c_char, isize) -> *mut PyObject;
type TupleFn = unsafe extern "C" fn(isize) -> *mut PyObject;
type TupleSetFn = unsafe extern "C" fn(*mut PyObject, isize, *mut PyObject) -> c_int;
type CallFn = unsafe extern "C" fn(*mut PyObject, *mut PyObject) -> *mut PyObject;
type UnaryFn = unsafe extern "C" fn(*mut PyObject) -> *mut PyObject;
type DecRefFn = unsafe extern "C" fn(*mut PyObject);
type VoidFn = unsafe extern "C" fn();

struct Python {
    is_initialized: IntFn,
    ensure: IntFn,
    release: ReleaseFn,
    import: ImportFn,
    getattr: GetAttrFn,
    string: StringFn,
    tuple: TupleFn,
    tuple_set: TupleSetFn,
    call: CallFn,
    type_of: UnaryFn,
    decref: DecRefFn,
    clear: VoidFn,
}

fn lookup(name: &str) -> Option<*mut c_void> {
    let name = CString::new(name).ok()?;
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the
    // process's global scope, where the interpreter's symbols are.
    let ptr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!ptr.is_null()).then_some(ptr)
}

fn python() -> Option<&'static Python> {
    static PYTHON: OnceLock<Option<Python>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            macro_rules! sym {
                ($name:literal, $ty:ty) => {
                    // SAFETY: the symbol is the CPython API function of that
                    // name, whose C signature the type spells out.
                    unsafe { std::mem::transmute::<*mut c_void, $ty>(lookup($name)?) }
                };
            }
            let python = Python {
                is_initialized: sym!("Py_IsInitialized", IntFn),
                ensure: sym!("PyGILState_Ensure", IntFn),
                release: sym!("PyGILState_Release", ReleaseFn),
                import: sym!("PyImport_ImportModule", ImportFn),
                getattr: sym!("PyObject_GetAttrString", GetAttrFn),
                string: sym!("PyUnicode_FromStringAndSize", StringFn),
                tuple: sym!("PyTuple_New", TupleFn),
                tuple_set: sym!("PyTuple_SetItem", TupleSetFn),
                call: sym!("PyObject_CallObject", CallFn),
                type_of: sym!("PyObject_Type", UnaryFn),
                decref: sym!("Py_DecRef", DecRefFn),
                clear: sym!("PyErr_Clear", VoidFn),
            };
            // SAFETY: hands the C++ side the interpreter's GIL and refcount
            // functions, which live as long as the process.
            unsafe { vramfit_raise_set_python_api(python.ensure, python.release, python.decref) };
            Some(python)
        })
        .as_ref()
        // SAFETY: a plain query of the interpreter's state.
        .filter(|p| unsafe { (p.is_initialized)() } != 0)
}

/// Builds `module.name(message)` under the GIL; returns (type, value), both
/// new references, or `None` if anything fails (the Python error is cleared).
fn python_exception(
    py: &Python,
    module: &str,
    name: &str,
    message: &str,
) -> Option<[*mut PyObject; 2]> {
    let module = CString::new(module).ok()?;
    let name = CString::new(name).ok()?;
    // SAFETY: CPython API calls under the GIL, each result checked before use;
    // every reference taken is either returned or released.
    unsafe {
        let gil = (py.ensure)();
        let result = (|| {
            let m = (py.import)(module.as_ptr());
            if m.is_null() {
                return None;
            }
            let class = (py.getattr)(m, name.as_ptr());
            (py.decref)(m);
            if class.is_null() {
                return None;
            }
            let text = (py.string)(message.as_ptr().cast(), message.len() as isize);
            let args = (py.tuple)(1);
            if text.is_null() || args.is_null() {
                (py.decref)(class);
                return None;
            }
            (py.tuple_set)(args, 0, text);
            let value = (py.call)(class, args);
            (py.decref)(args);
            (py.decref)(class);
            if value.is_null() {
                return None;
            }
            Some([(py.type_of)(value), value])
        })();
        if result.is_none() {
            (py.clear)();
        }
        (py.release)(gil);
        result
    }
}

/// Throws the refusal to PyTorch; never returns.
///
/// Must be called outside `catch_unwind` and with no lock held: the
/// exception unwinds through the caller into PyTorch's C++.
pub fn raise(message: &str, out_of_memory: bool) -> ! {
    let text = CString::new(message.replace('\0', " ")).expect("NULs replaced");
    if let Some(py) = python() {
        let (module, name) = if out_of_memory {
            ("torch", "OutOfMemoryError")
        } else {
            ("builtins", "RuntimeError")
        };
        if let Some([ty, value]) = python_exception(py, module, name, message) {
            // SAFETY: the exception takes over both references.
            unsafe { vramfit_raise_python(ty, value, text.as_ptr()) };
            unreachable!("vramfit_raise_python throws");
        }
    }
    // SAFETY: throws a C++ exception carrying a copy of the message.
    unsafe { vramfit_raise_plain(text.as_ptr()) };
    unreachable!("vramfit_raise_plain throws")
}
