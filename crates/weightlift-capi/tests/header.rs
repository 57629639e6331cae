//! `include/weightlift.h` is generated from this crate by cbindgen; this test regenerates it and fails if the
//! checked-in copy differs (run with `WEIGHTLIFT_BLESS=1` to rewrite it after changing the API).

use std::path::Path;

#[test]
fn header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let checked_in = crate_dir.join("../../include/weightlift.h");
    if std::env::var_os("WEIGHTLIFT_BLESS").is_some() {
        std::fs::write(&checked_in, &generated).expect("write include/weightlift.h");
        return;
    }
    let current = std::fs::read(&checked_in).unwrap_or_default();
    assert!(
        current == generated,
        "include/weightlift.h is out of date: run `WEIGHTLIFT_BLESS=1 cargo test -p weightlift-capi --test header`"
    );
}
