//! Links the RBD backend (`dev::rbd`) against librbd and librados when the
//! `rbd` feature is on (the default) and the libraries are installed.
//! Without them the build goes on and `rbd:` devices are refused with a
//! clear message: a machine without Ceph's client libraries can still
//! build and use Canopy on image files and block devices.

use std::path::Path;

/// Where Debian, Fedora and a from-source install put the libraries.
const LIB_DIRS: [&str; 5] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
];

fn main() {
    println!("cargo:rustc-check-cfg=cfg(canopy_rbd)");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CANOPY_RBD_LIB_DIR");
    if std::env::var_os("CARGO_FEATURE_RBD").is_none() {
        return;
    }
    let extra = std::env::var("CANOPY_RBD_LIB_DIR").ok();
    let dirs = extra.iter().map(String::as_str).chain(LIB_DIRS);
    let found = dirs.into_iter().find(|d| {
        Path::new(d).join("librbd.so").exists() && Path::new(d).join("librados.so").exists()
    });
    match found {
        Some(dir) => {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-lib=dylib=rbd");
            println!("cargo:rustc-link-lib=dylib=rados");
            println!("cargo:rustc-cfg=canopy_rbd");
        }
        None => println!(
            "cargo:warning=librbd/librados not found: building without the RBD backend \
             (apt-get install librbd-dev librados-dev, or set CANOPY_RBD_LIB_DIR)"
        ),
    }
}
