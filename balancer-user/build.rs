//! Builds the XDP program (balancer-ebpf) for bpfel-unknown-none with the
//! nightly toolchain and bpf-linker (see scripts/setup.sh), and leaves the
//! objects in OUT_DIR (balancer-xdp, balancer-decap) for
//! `include_bytes_aligned!`.
//!
//! With `AYA_BUILD_SKIP=1` (aya-build's switch) no object is built and an
//! empty stub is written for each instead, so `cargo check` and `cargo clippy` of the
//! userspace code need neither nightly nor bpf-linker; loading then fails.
use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let out_dir = std::env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?;
    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        // Both objects the crate embeds: the balancer and the backends'
        // decapsulation program.
        for name in ["balancer-xdp", "balancer-decap"] {
            let object = std::path::Path::new(&out_dir).join(name);
            if !object.exists() {
                std::fs::write(&object, []).context("writing a stub object")?;
            }
        }
    }
    let root = std::env::var("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = std::path::Path::new(&root).join("../balancer-ebpf");
    let ebpf_dir = ebpf_dir.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    println!("cargo:rerun-if-changed=../balancer-common/src");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "balancer-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
