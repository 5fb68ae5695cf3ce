//! Golden files of what a VIP's settings look like outside the daemon: the
//! OpenAPI schemas of `VipSettings`, `VipPatch` and `VipEntry`, a
//! configuration with every setting set read and exported back, the error
//! of a misspelt key, and the state file of that configuration
//! (`testdata/settings`; `UPDATE_GOLDEN=1` writes them). The CLI's faces
//! (`vip add --help`, `vip set --help`, the requests they send) are the
//! binary's test (`main.rs`, `vip_settings_goldens`).

use std::path::PathBuf;

use balancer::{
    model::{
        command::{Command, Rules},
        config::{self, Config},
        persist::{read_state, write_state, Persisted},
    },
    State, Timeouts,
};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/settings")
}

/// Compares `got` with the golden file `name`, or writes it with
/// `UPDATE_GOLDEN=1`.
fn golden(name: &str, got: &str) {
    let file = dir().join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(dir()).unwrap();
        std::fs::write(&file, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", file.display()));
    assert!(
        got == want,
        "{} differs from its golden file (UPDATE_GOLDEN=1 rewrites it); now:\n{got}",
        file.display()
    );
}

/// Every VIP setting away from its default, over four VIPs (some settings
/// exclude others: a source rate needs NAT, consistent candidates a
/// tunnel, the latency signal NAT).
const RICH: &str = r#"
[timeouts]
half_open = "20s"
established = "10m"
closing = "15s"
orphan = "1m"
unproven = "4m"

[[vip]]
address = "10.0.0.10:80"
choices = "all"
health = { kind = { type = "http", path = "/healthz", status = 204 }, port = 8081, interval = "5s", timeout = "2s", rise = 3, fall = 4 }
no_healthy = "drop"
slow_start = "30s"
eject_after = 7
eject_min_sources = 2
max_ejection_percent = 34
ejection_time = "45s"
persistence = "10m"
persistence_netmask = 24
allow_host_address = true
protocol = "both"
udp_timeout = "2m"
quic_server_id_len = 2
allow_sources = ["10.0.0.0/8", "192.0.2.7"]
deny_sources = ["10.9.0.0/16"]
backend_max_conns = 500
source_rate = 20
source_burst = 40
source_rate_prefix_v4 = 24
source_rate_prefix_v6 = 56
prefer_zone_below = 8

[[vip.backend]]
address = "10.1.0.11:8080"
weight = 2
zone = "a"

[[vip.backend]]
address = "10.1.0.12:8080"
drained = true
health = { kind = { type = "tcp" } }

[[vip]]
address = "10.0.0.11:443"
choices = 3
mode = "gue"
encap_source = "10.0.9.1"
gue_port = 7000
health = "off"
candidates = "consistent"
signal = "agent"
agent_port = 5555
agent_interval = "500ms"

[[vip.backend]]
address = "10.1.0.21:443"

[[vip]]
address = "[2001:db8::10]:443"
mode = "dsr"
persistence = "5m"
persistence_netmask = 64

[vip.health]
kind = { type = "path" }

[[vip.backend]]
address = "[2001:db8:2::10]:443"

[[vip]]
address = "10.0.0.12:80"
mode = "ipip"
encap_source = "10.0.9.1"
no_healthy = "fallback"

[[vip.backend]]
address = "10.1.0.31:80"

[[vip]]
address = "10.0.0.13:80"
signal = "latency"

[[vip.backend]]
address = "10.1.0.41:8080"
"#;

/// The running state `RICH` makes, and its timeouts.
fn rich_state() -> (Config, State, Timeouts) {
    let c = config::parse(RICH).unwrap();
    config::check_config(&c).unwrap();
    let mut st = State::default();
    let rules = Rules::default();
    for cmd in config::plan(&Config::default(), &c) {
        st.apply(&cmd, &rules)
            .unwrap_or_else(|e| panic!("{}: {e}", cmd.describe()));
    }
    let t = match config::plan(&Config::default(), &c).first() {
        Some(Command::Timeouts(t)) => *t,
        other => panic!("no timeouts first: {other:?}"),
    };
    (c, st, t)
}

#[test]
fn openapi_schemas_of_the_settings() {
    let doc: serde_json::Value =
        serde_json::from_str(&balancer::serve::http::openapi_json()).unwrap();
    let schemas = &doc["components"]["schemas"];
    let mut out = serde_json::Map::new();
    for name in [
        "VipSettings",
        "VipPatch",
        "VipEntry",
        "HealthSetting",
        "ChoicesValue",
    ] {
        let s = &schemas[name];
        assert!(!s.is_null(), "no schema {name}");
        out.insert(name.into(), s.clone());
    }
    golden(
        "openapi-schemas.json",
        &(serde_json::to_string_pretty(&out).unwrap() + "\n"),
    );
}

#[test]
fn a_configuration_with_every_setting_reads_and_exports_back() {
    let (c, st, t) = rich_state();
    // The file as read, written out again.
    let read = config::to_toml(&c).unwrap();
    golden("rich-read.toml", &read);
    // Through the running state and back: `config export`.
    let exported = config::to_toml(&config::export(&st, &t)).unwrap();
    golden("rich-export.toml", &exported);
    // What is exported reads back to the same running state.
    let again = config::parse(&exported).unwrap();
    assert!(config::plan(&config::export(&st, &t), &again).is_empty());
}

#[test]
fn a_misspelt_key_is_refused_by_name() {
    let mut errors = String::new();
    for (what, text) in [
        (
            "a VIP's key",
            "[[vip]]\naddress = \"10.0.0.10:80\"\nprefer_zone_bellow = 8\n",
        ),
        (
            "a VIP's key after good ones",
            "[[vip]]\naddress = \"10.0.0.10:80\"\nmode = \"dsr\"\nsource_rate_prefix = 24\n",
        ),
        (
            "a key of the health table",
            "[[vip]]\naddress = \"10.0.0.10:80\"\n[vip.health]\nrize = 2\n",
        ),
        (
            "a value of the wrong type",
            "[[vip]]\naddress = \"10.0.0.10:80\"\nslow_start = 30\n",
        ),
        ("no address", "[[vip]]\nchoices = 2\n"),
    ] {
        let e = config::parse(text).unwrap_err().to_string();
        errors.push_str(&format!("# {what}\n{e}\n\n"));
    }
    assert!(errors.contains("prefer_zone_bellow"), "{errors}");
    golden("misspelt.txt", &errors);
}

#[test]
fn the_state_file_of_every_setting() {
    let (c, st, _) = rich_state();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let p = Persisted {
        state: st,
        applied: [("/etc/p2c-balancer/balancer.toml".to_string(), c)]
            .into_iter()
            .collect(),
        ..Persisted::default()
    };
    write_state(&path, &p).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    golden("state.json", &text);
    assert_eq!(read_state(&path).unwrap(), Some(p), "read back");
}
