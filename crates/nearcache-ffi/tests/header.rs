//! The committed C header is what cbindgen generates from the source.
//!
//! After changing the ABI, regenerate it with
//! `NEARCACHE_BLESS_HEADER=1 cargo test -p nearcache-ffi --test header`.

use std::path::PathBuf;

#[test]
fn committed_header_matches_the_source() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let path = crate_dir.join("include").join("nearcache.h");
    if std::env::var_os("NEARCACHE_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write header");
    }
    let committed = std::fs::read(&path).expect("include/nearcache.h exists");
    assert!(
        committed == generated,
        "include/nearcache.h is stale: regenerate it with \
         NEARCACHE_BLESS_HEADER=1 cargo test -p nearcache-ffi --test header"
    );
}
