fn main() {
    // Never unloaded: the atexit and atfork handlers, and wrappers handed out to the program,
    // must stay valid for the life of the process.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    // `dlsym` is defined in assembly, so rustc does not list it among the exports.
    let map = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("exports.map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rerun-if-changed=exports.map");
}
