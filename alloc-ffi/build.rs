//! Compiles the C++ half of the library: the functions that throw the
//! exceptions PyTorch turns into Python errors.

fn main() {
    println!("cargo:rerun-if-changed=src/raise.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("src/raise.cpp")
        .warnings(true)
        .compile("vramfit_alloc_raise");
}
