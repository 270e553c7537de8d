//! The shared library's SONAME is libblkhash.so.0, as libblkhash 0.11's,
//! so programs linked against either load the other.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libblkhash.so.0");
    println!("cargo:rerun-if-changed=build.rs");
}
