//! Lays the code of liblivecov.so that a warm dump never runs apart
//! (`cold-code.ld`), and names the library. Which symbols it exports is
//! rustc's own version script: the C API (`#[no_mangle]`) and nothing else.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liblivecov.so");
    let cold = std::path::Path::new(&dir).join("cold-code.ld");
    println!("cargo:rerun-if-changed={}", cold.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{}", cold.display());
}
