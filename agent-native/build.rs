//! Exports only the `livecov_*` symbols from liblivecov.so (a linker
//! version script), whatever the Rust standard library would export.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let script = std::path::Path::new(&dir).join("livecov.map");
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", script.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liblivecov.so");
}
