//! The model's side of issue 43's rough edges: a backend's check turned
//! off on its own, one health parameter changed alone, settings that mean
//! nothing where they are given, refused with their argument named.

use std::{net::SocketAddr, time::Duration};

use crate::model::{
    api::VipPatch,
    config,
    state::{BackendConfig, BackendHealth, ForwardingMode, HealthCheck, VipConfig, VipSettings},
};

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A backend of the state file, its `health` as given (`None`: no key).
fn backend(addr: &str, health: Option<&str>) -> BackendConfig {
    let h = health.map_or(String::new(), |h| format!(",\"health\":{h}"));
    serde_json::from_str(&format!(
        "{{\"addr\":\"{addr}\",\"state\":\"active\",\"slot\":0,\"generation\":1{h}}}"
    ))
    .unwrap_or_else(|e| panic!("{addr} {health:?}: {e}"))
}

#[test]
fn a_backends_check_is_its_own_off_or_the_vips() {
    let vip_check = HealthCheck {
        interval: Duration::from_secs(5),
        ..HealthCheck::default()
    };
    let v = VipConfig {
        addr: a("10.0.0.10:80"),
        index: 0,
        settings: VipSettings {
            health: Some(vip_check.clone()),
            ..VipSettings::default()
        },
        backends: vec![
            // Off on its own (written by this build).
            backend("10.0.2.1:80", Some("\"off\"")),
            // The VIP's: no key (every build), null, or "vip".
            backend("10.0.2.2:80", None),
            backend("10.0.2.3:80", Some("null")),
            backend("10.0.2.4:80", Some("\"vip\"")),
            // A check of its own (every build).
            backend(
                "10.0.2.5:80",
                Some("{\"kind\":{\"type\":\"tcp\"},\"rise\":4}"),
            ),
        ],
    };
    let checks: Vec<Option<u32>> = v
        .backends
        .iter()
        .map(|b| v.check_for(b).map(|c| c.rise))
        .collect();
    assert_eq!(checks, [None, Some(2), Some(2), Some(2), Some(4)]);
    // Written back: "off" stays, the VIP's is no key (as before).
    let json: Vec<String> = v
        .backends
        .iter()
        .map(|b| serde_json::to_string(b).unwrap())
        .collect();
    assert!(json[0].contains("\"health\":\"off\""), "{}", json[0]);
    assert!(!json[1].contains("health"), "{}", json[1]);
    assert!(json[4].contains("\"rise\":4"), "{}", json[4]);
    // The configuration file: `health = "off"` for a backend, read and
    // exported back; `"vip"` is the default and is left out.
    let text = "[[vip]]\naddress = \"10.0.0.10:80\"\n\n[[vip.backend]]\naddress = \
                \"10.0.2.1:80\"\nhealth = \"off\"\n\n[[vip.backend]]\naddress = \
                \"10.0.2.2:80\"\nhealth = \"vip\"\n";
    let c = config::read(text).unwrap();
    let out = config::to_toml(&c).unwrap();
    assert_eq!(out.matches("health = \"off\"").count(), 1, "{out}");
    assert!(!out.contains("\"vip\""), "{out}");
}

#[test]
fn one_health_parameter_changes_alone() {
    let s = VipSettings {
        health: Some(HealthCheck {
            interval: Duration::from_secs(5),
            ..HealthCheck::default()
        }),
        ..VipSettings::default()
    };
    let p: VipPatch = serde_json::from_str(r#"{"health":{"change":{"fall":5}}}"#).unwrap();
    let h = p.apply(&s).health.unwrap();
    assert_eq!(
        (h.fall, h.interval, h.rise),
        (5, Duration::from_secs(5), 2),
        "the other parameters are the VIP's"
    );
    assert_eq!(p.apply_checked(&s).unwrap(), p.apply(&s));
    // A VIP without a check has nothing to change: refused, the parameter
    // named.
    let off = VipSettings {
        health: None,
        ..VipSettings::default()
    };
    let e = p.apply_checked(&off).unwrap_err().to_string();
    assert!(e.starts_with("health.fall: needs health"), "{e}");
    // A backend's: its own check's, else its VIP's, made its own; none
    // when its checks are off.
    let change = p.health.clone().unwrap();
    let own = BackendHealth::Check(HealthCheck {
        rise: 7,
        ..HealthCheck::default()
    });
    let got = |b: &BackendHealth| change.for_backend(b, s.health.as_ref());
    let fall_of = |b: BackendHealth| b.own().map(|h| (h.fall, h.rise, h.interval));
    assert_eq!(
        fall_of(got(&BackendHealth::Vip).unwrap()),
        Some((5, 2, Duration::from_secs(5)))
    );
    assert_eq!(
        fall_of(got(&own).unwrap()),
        Some((5, 7, Duration::from_secs(2)))
    );
    let e = got(&BackendHealth::Off).unwrap_err().to_string();
    assert!(e.starts_with("health.fall: needs health"), "{e}");
}

#[test]
fn an_encapsulation_source_needs_an_encapsulating_mode() {
    let vip = a("10.0.0.10:80");
    for mode in [ForwardingMode::Dsr, ForwardingMode::Nat] {
        let s = VipSettings {
            mode,
            encap_source: Some("10.0.9.1".parse().unwrap()),
            ..VipSettings::default()
        };
        let e = s.validate_for(vip).unwrap_err().to_string();
        assert!(e.contains("encap_source"), "{e}");
        assert!(e.contains("ipip or gue"), "{e}");
    }
    // The file too, with its line.
    let e = config::read(
        "[[vip]]\naddress = \"10.0.0.10:80\"\nmode = \"dsr\"\nencap_source = \"10.0.9.1\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("line 4"), "{e}");
    // The control: the tunnel modes take it.
    let ok = VipSettings {
        mode: ForwardingMode::Ipip,
        encap_source: Some("10.0.9.1".parse().unwrap()),
        ..VipSettings::default()
    };
    ok.validate_for(vip).unwrap();
    // `vip set --mode dsr` on that VIP drops the source it no longer uses;
    // with `--encap-source` it is refused.
    let to_dsr: VipPatch = serde_json::from_str(r#"{"mode":"dsr"}"#).unwrap();
    let s = to_dsr.apply_checked(&ok).unwrap();
    assert_eq!((s.mode, s.encap_source), (ForwardingMode::Dsr, None));
    let both: VipPatch =
        serde_json::from_str(r#"{"mode":"dsr","encap_source":"10.0.9.2"}"#).unwrap();
    assert!(both.apply_checked(&ok).unwrap().validate().is_err());
    // A state file of an earlier build that holds one is read, the source
    // dropped with a line for the log.
    let mut st = crate::model::state::State::default();
    st.vips.insert(
        vip,
        VipConfig {
            addr: vip,
            index: 0,
            settings: VipSettings {
                mode: ForwardingMode::Dsr,
                encap_source: Some("10.0.9.1".parse().unwrap()),
                ..VipSettings::default()
            },
            backends: Vec::new(),
        },
    );
    assert!(st.validate().is_err());
    let w = st.upgrade();
    assert!(w.len() == 1 && w[0].contains("10.0.9.1"), "{w:?}");
    st.validate().unwrap();
}

#[test]
fn a_persistence_netmask_is_refused_with_its_familys_range() {
    let with = |m| VipSettings {
        persistence: Duration::from_secs(60),
        persistence_netmask: Some(m),
        ..VipSettings::default()
    };
    let e = with(64)
        .validate_for(a("10.0.0.10:80"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("persistence_netmask"), "{e}");
    assert!(e.contains("1..=32"), "{e}");
    // An IPv6 VIP groups its clients by up to 128 bits: /64 is a client's
    // network (as a source rate's default), and is taken.
    with(64).validate_for(a("[2001:db8::10]:80")).unwrap();
    with(128).validate_for(a("[2001:db8::10]:80")).unwrap();
}
