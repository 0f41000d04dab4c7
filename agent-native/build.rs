//! Lays the code of liblivecov.so that warm dumps run side by side, ahead
//! of the rest (`warm-code.ld`), and the code they never run apart
//! (`cold-code.ld`), and names the library. Which symbols it exports is
//! rustc's own version script: the C API (`#[no_mangle]`) and nothing else.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liblivecov.so");
    for script in ["warm-code.ld", "cold-code.ld"] {
        let script = std::path::Path::new(&dir).join(script);
        println!("cargo:rerun-if-changed={}", script.display());
        println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{}", script.display());
    }
}
