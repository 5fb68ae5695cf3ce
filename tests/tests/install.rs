//! The install steps of the systemd unit, run for real under a temporary
//! root (`contrib/install.sh --destdir`): a stripped release build, the man
//! page the unit's `Documentation=` names, completions, a default
//! configuration the daemon accepts, and the installed unit clean under
//! `systemd-analyze verify`. Controls: the debug build would fail the size
//! check, and a unit naming a missing binary fails the verify.

use std::{path::Path, process::Command};

/// Largest installed binary accepted, bytes: the debug build is about
/// 70 MB (line tables only), the stripped release build about 10 MB.
const MAX_INSTALLED: u64 = 40 << 20;

fn verify(unit: &Path) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(unit)
        .output()
        .expect("running systemd-analyze (installed by scripts/setup.sh)");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    // Lines about other units of the machine are not this unit's.
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("p2c-balancer"))
        .collect();
    (out.status.success() && ours.is_empty(), said)
}

#[test]
fn the_install_steps_install_a_release_build_its_man_page_and_a_clean_unit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dest = tempfile::tempdir().unwrap();
    let out = Command::new("sh")
        .arg(root.join("contrib/install.sh"))
        .arg("--destdir")
        .arg(dest.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "install.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = dest.path().join("usr/local/bin/balancer");
    let size = std::fs::metadata(&bin).unwrap().len();
    assert!(size < MAX_INSTALLED, "installed binary of {size} bytes");
    // Control: the debug build is what the size check keeps out.
    let debug = root.join("target/debug/balancer");
    if let Ok(m) = std::fs::metadata(&debug) {
        assert!(
            m.len() > MAX_INSTALLED,
            "the debug build is {} bytes",
            m.len()
        );
    }
    let v = Command::new(&bin).arg("--version").output().unwrap();
    assert!(v.status.success(), "the installed binary does not run");
    let man = std::fs::read_to_string(dest.path().join("usr/local/share/man/man1/balancer.1"))
        .expect("the man page the unit names");
    assert!(man.contains(".TH"), "balancer.1 is not a man page");
    assert!(dest
        .path()
        .join("usr/local/share/man/man1/balancer-backend-drain.1")
        .exists());
    assert!(dest
        .path()
        .join("usr/local/share/bash-completion/completions/balancer")
        .exists());
    // The default configuration is one the daemon reads.
    let conf = std::fs::read_to_string(dest.path().join("etc/p2c-balancer/balancer.toml")).unwrap();
    balancer::model::config::parse(&conf).expect("the default configuration parses");
    let unit = dest.path().join("etc/systemd/system/p2c-balancer.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(
        text.contains("Documentation=man:balancer(1)") && !text.contains("target/debug"),
        "{text}"
    );
    // Verified with its binary where the temporary root put it.
    let check = dest.path().join("p2c-balancer.service");
    std::fs::write(
        &check,
        text.replace("/usr/local/bin/balancer", &bin.display().to_string()),
    )
    .unwrap();
    let (ok, said) = verify(&check);
    assert!(ok, "systemd-analyze verify: {said}");
    // Control: a unit whose binary is missing is refused.
    let bad = dest.path().join("p2c-balancer-bad.service");
    std::fs::write(
        &bad,
        text.replace("/usr/local/bin/balancer", "/nonexistent/balancer"),
    )
    .unwrap();
    let (ok, said) = verify(&bad);
    assert!(
        !ok,
        "systemd-analyze passed a unit naming a missing binary: {said}"
    );
    // Installing again keeps an operator's configuration.
    std::fs::write(
        dest.path().join("etc/p2c-balancer/balancer.toml"),
        "# mine\n",
    )
    .unwrap();
    let again = Command::new("sh")
        .arg(root.join("contrib/install.sh"))
        .arg("--destdir")
        .arg(dest.path())
        .output()
        .unwrap();
    assert!(again.status.success());
    assert_eq!(
        std::fs::read_to_string(dest.path().join("etc/p2c-balancer/balancer.toml")).unwrap(),
        "# mine\n"
    );
}
