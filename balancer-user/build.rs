//! Builds the XDP program (balancer-ebpf) for bpfel-unknown-none with the
//! nightly toolchain pinned in balancer-ebpf/rust-toolchain.toml and
//! bpf-linker (see scripts/setup.sh), and leaves the
//! objects in OUT_DIR (balancer-xdp, balancer-decap, and the test bed's
//! fault injector balancer-faults) for
//! `include_bytes_aligned!`.
//!
//! With `AYA_BUILD_SKIP=1` (aya-build's switch) no object is built and an
//! empty stub is written for each instead, so `cargo check` and `cargo clippy` of the
//! userspace code need neither nightly nor bpf-linker; loading then fails.
use anyhow::{anyhow, Context as _};

/// The commit this build is from, for `balancer --version`: the
/// `BALANCER_COMMIT` environment variable when set (a package built outside
/// a checkout), else `git rev-parse`, else `unknown`.
fn commit(root: &std::path::Path) -> String {
    println!("cargo:rerun-if-env-changed=BALANCER_COMMIT");
    if let Ok(c) = std::env::var("BALANCER_COMMIT") {
        return c;
    }
    // Rebuilt when the checked-out commit moves: HEAD (in the worktree's own
    // git directory), the branch's ref and packed-refs (in the common one).
    // Only files that exist are named: cargo takes a named file that is
    // missing as changed, and would rebuild this crate on every build.
    let git_dir = |arg: &str| git(root, &["rev-parse", arg]).map(std::path::PathBuf::from);
    if let (Some(own), Some(common)) = (
        git_dir("--absolute-git-dir"),
        git_dir("--git-common-dir").map(|d| root.join(d)),
    ) {
        let head = own.join("HEAD");
        let mut watched = vec![head.clone(), common.join("packed-refs")];
        if let Ok(text) = std::fs::read_to_string(&head) {
            if let Some(r) = text.trim().strip_prefix("ref: ") {
                watched.push(common.join(r));
            }
        }
        for f in watched.into_iter().filter(|f| f.exists()) {
            println!("cargo:rerun-if-changed={}", f.display());
        }
    }
    git(root, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
}

/// What `git args` prints in `root`'s checkout, trimmed; `None` when git
/// fails there or prints nothing.
fn git(root: &std::path::Path, args: &[&str]) -> Option<String> {
    std::process::Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The toolchain that builds the eBPF objects: `channel` in
/// balancer-ebpf/rust-toolchain.toml. aya-build runs `rustup run
/// <toolchain> cargo build ...`, which ignores toolchain files, so the
/// channel is named here.
fn ebpf_toolchain(ebpf_dir: &std::path::Path) -> anyhow::Result<String> {
    let file = ebpf_dir.join("rust-toolchain.toml");
    println!("cargo:rerun-if-changed={}", file.display());
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let parsed: ToolchainFile =
        toml::from_str(&text).with_context(|| format!("reading {}", file.display()))?;
    Ok(parsed.toolchain.channel)
}

/// The part of a rust-toolchain.toml read here: `[toolchain] channel`.
#[derive(serde::Deserialize)]
struct ToolchainFile {
    toolchain: ToolchainSection,
}

/// `[toolchain]` of a rust-toolchain.toml.
#[derive(serde::Deserialize)]
struct ToolchainSection {
    /// The toolchain's name for rustup, e.g. `nightly-2026-05-20`.
    channel: String,
}

fn main() -> anyhow::Result<()> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")?;
    println!(
        "cargo:rustc-env=BALANCER_COMMIT={}",
        commit(std::path::Path::new(&manifest))
    );
    let out_dir = std::env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?;
    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        // The objects the crate embeds: the balancer, the backends'
        // decapsulation program and the test bed's fault injector.
        for name in [
            "balancer-xdp",
            "balancer-decap",
            "balancer-dispatcher",
            "balancer-faults",
        ] {
            let object = std::path::Path::new(&out_dir).join(name);
            if !object.exists() {
                std::fs::write(&object, []).context("writing a stub object")?;
            }
        }
    }
    let root = std::env::var("CARGO_MANIFEST_DIR")?;
    let ebpf_path = std::path::Path::new(&root).join("../balancer-ebpf");
    let toolchain = ebpf_toolchain(&ebpf_path)?;
    let ebpf_dir = ebpf_path
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    println!("cargo:rerun-if-changed=../balancer-common/src");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "balancer-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
}
