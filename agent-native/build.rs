//! Exports only the `livecov_*` symbols from liblivecov.so (a linker
//! version script), whatever the Rust standard library would export, and
//! lays the code a warm dump never runs apart (`cold-code.ld`).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let script = std::path::Path::new(&dir).join("livecov.map");
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", script.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liblivecov.so");
    let cold = std::path::Path::new(&dir).join("cold-code.ld");
    println!("cargo:rerun-if-changed={}", cold.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{}", cold.display());
}
