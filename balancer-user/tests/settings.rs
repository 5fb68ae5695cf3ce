//! Golden files of what a VIP's settings look like outside the daemon: the
//! OpenAPI schemas of `VipSettings`, `VipPatch` and `VipEntry`, a
//! configuration with every setting set read and exported back, the error
//! of a misspelt key, and the state file of that configuration
//! (`testdata/settings`; `UPDATE_GOLDEN=1` writes them). The CLI's faces
//! (`vip add --help`, `vip set --help`, the requests they send) are the
//! binary's test (`main.rs`, `vip_settings_goldens`).
//!
//! They were written by the code before the settings' table
//! (`src/settings.rs`), and hold what every setting then looked like. A
//! setting added since adds to the faces that list every setting (a
//! property of the OpenAPI schemas, a key in the list an unknown key's
//! error gives): what a golden file does not have is left out of the
//! comparison there, and everything it has must be as it was, in the same
//! order. (A new setting is left out of files and answers while it has its
//! default, `#[omit_default]`, so the other golden files do not change.)

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
    golden_with(name, got, |got, _| got.to_string());
}

/// [`golden`], comparing `added(got, golden)`: `got` without what was
/// added since the golden file was written.
fn golden_with(name: &str, got: &str, added: impl Fn(&str, &str) -> String) {
    let file = dir().join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(dir()).unwrap();
        std::fs::write(&file, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", file.display()));
    let got = added(got, &want);
    assert!(
        got == want,
        "{} differs from its golden file (UPDATE_GOLDEN=1 rewrites it); now:\n{got}",
        file.display()
    );
}

/// JSON text with every object's keys in sorted order, pretty-printed:
/// the one form the golden files hold. serde_json keeps a `Value`'s keys
/// sorted, or in insertion order when a crate of the build turns on its
/// `preserve_order` feature (`cargo test --workspace` does, through the
/// test bed's dependencies; `-p balancer-user` does not), and JSON's key
/// order carries no meaning.
fn sorted_json(text: &str) -> String {
    fn sort(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => {
                let mut kv: Vec<(String, serde_json::Value)> = m.into_iter().collect();
                kv.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(kv.into_iter().map(|(k, v)| (k, sort(v))).collect())
            }
            serde_json::Value::Array(a) => {
                serde_json::Value::Array(a.into_iter().map(sort).collect())
            }
            other => other,
        }
    }
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    serde_json::to_string_pretty(&sort(v)).unwrap() + "\n"
}

/// The schemas `got` (JSON) without the properties the golden `want`'s
/// same schema does not have (settings added since).
fn without_new_properties(got: &str, want: &str) -> String {
    let mut got: serde_json::Value = serde_json::from_str(got).unwrap();
    let want: serde_json::Value = serde_json::from_str(want).unwrap();
    if let Some(schemas) = got.as_object_mut() {
        for (name, s) in schemas.iter_mut() {
            let w = &want[name];
            if let Some(props) = s.get_mut("properties").and_then(|p| p.as_object_mut()) {
                props.retain(|k, _| !w["properties"][k].is_null());
            }
            if let Some(req) = s.get_mut("required").and_then(|r| r.as_array_mut()) {
                let had = w["required"].as_array().cloned().unwrap_or_default();
                req.retain(|k| had.contains(k));
            }
        }
    }
    sorted_json(&serde_json::to_string(&got).unwrap())
}

/// `got` without the names in its lists of known keys ("expected one of
/// `a`, `b`") that the same line of the golden `want` does not have.
fn without_new_keys(got: &str, want: &str) -> String {
    const LIST: &str = "expected one of ";
    let want: Vec<&str> = want.split_inclusive('\n').collect();
    got.split_inclusive('\n')
        .enumerate()
        .map(|(i, line)| {
            let (Some((head, list)), Some((_, had))) = (
                line.split_once(LIST),
                want.get(i).and_then(|w| w.split_once(LIST)),
            ) else {
                return line.to_string();
            };
            let had: Vec<&str> = had.trim_end().split(", ").collect();
            let end = if line.ends_with('\n') { "\n" } else { "" };
            let kept: Vec<&str> = list
                .trim_end()
                .split(", ")
                .filter(|k| had.contains(k))
                .collect();
            format!("{head}{LIST}{}{end}", kept.join(", "))
        })
        .collect()
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
    // Every setting has its three faces: the state's, the patch's, the
    // file's (beside the entry's address and backends).
    let keys = |name: &str, but: &[&str]| -> Vec<String> {
        let props = schemas[name]["properties"].as_object().unwrap();
        let mut k: Vec<String> = props
            .keys()
            .filter(|k| !but.contains(&k.as_str()))
            .cloned()
            .collect();
        k.sort();
        k
    };
    let state = keys("VipSettings", &[]);
    assert!(state.len() >= 29, "{state:?}");
    assert_eq!(keys("VipPatch", &[]), state);
    assert_eq!(keys("VipEntry", &["address", "backend"]), state);
    golden_with(
        "openapi-schemas.json",
        &sorted_json(&serde_json::to_string(&out).unwrap()),
        |got, want| {
            // Control: a property added is left out; one changed is not.
            let mut added: serde_json::Value = serde_json::from_str(want).unwrap();
            added["VipPatch"]["properties"]["zzz"] = serde_json::json!({"type": "string"});
            let added = sorted_json(&serde_json::to_string(&added).unwrap());
            assert_eq!(without_new_properties(&added, want), want);
            let changed = want.replacen("Choices per new flow", "Choices", 1);
            assert_ne!(without_new_properties(&changed, want), want);
            without_new_properties(got, want)
        },
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
    golden_with("misspelt.txt", &errors, |got, want| {
        // Control: a key added is left out; one gone is not.
        let added = want.replace("`backend`", "`zzz`, `backend`");
        assert_eq!(without_new_keys(&added, want), want);
        let gone = want.replace("`signal`, ", "");
        assert_ne!(without_new_keys(&gone, want), want);
        without_new_keys(got, want)
    });
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
    golden("state.json", &sorted_json(&text));
    assert_eq!(read_state(&path).unwrap(), Some(p), "read back");
}
