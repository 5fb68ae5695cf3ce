use super::*;
use crate::model::{
    command::{check_new_backends, check_new_vip, check_settings_change},
    state::{BackendConfig, VipConfig},
};

#[test]
fn ipv4_mapped_addresses_in_a_file_are_refused() {
    for (text, at) in [
        (
            "[[vip]]\naddress = \"[::ffff:10.0.0.10]:80\"\n",
            "VIP [::ffff:10.0.0.10]:80",
        ),
        (
            "[[vip]]\naddress = \"[2001:db8::10]:80\"\n[[vip.backend]]\naddress = \"[::ffff:10.1.0.11]:8080\"\n",
            "backend [::ffff:10.1.0.11]:8080",
        ),
        (
            "[[vip]]\naddress = \"[2001:db8::10]:80\"\nmode = \"ipip\"\nencap_source = \"::ffff:10.0.9.1\"\n",
            "encap_source",
        ),
    ] {
        let c = crate::model::config::parse(text).unwrap();
        let e = check_config(&c).unwrap_err().to_string();
        assert!(e.contains("IPv4-mapped") && e.contains(at), "{e}");
    }
}

fn state(vips: &[(&str, &[&str])]) -> State {
    let mut s = State::default();
    let mut slot = 0;
    for (index, (v, backends)) in vips.iter().enumerate() {
        let addr: SocketAddr = v.parse().unwrap();
        let backends = backends
            .iter()
            .map(|b| {
                slot += 1;
                BackendConfig {
                    addr: b.parse().unwrap(),
                    state: BackendState::Active,
                    slot,
                    generation: 1,
                    weight: 1,
                    health: crate::model::state::BackendHealth::Vip,
                    zone: None,
                }
            })
            .collect();
        s.vips.insert(
            addr,
            VipConfig {
                addr,
                index: index as u32,
                settings: VipSettings::default(),
                backends,
            },
        );
    }
    for a in s.backend_uses().into_keys().collect::<Vec<_>>() {
        s.server_for(a).unwrap();
    }
    s
}

fn host(addrs: &[&str]) -> BTreeSet<IpAddr> {
    addrs.iter().map(|a| a.parse().unwrap()).collect()
}

fn addr(a: &str) -> SocketAddr {
    a.parse().unwrap()
}

/// The error's text, which must name every one of `names`.
fn refused(r: Result<()>, names: &[&str]) {
    let e = r.expect_err("accepted").to_string();
    for n in names {
        assert!(e.contains(n), "{n:?} not in {e:?}");
    }
}

#[test]
fn a_backend_on_a_vips_address_is_a_loop() {
    let st = state(&[("10.0.0.10:80", &[]), ("10.0.0.20:80", &[])]);
    let none = host(&[]);
    // Another VIP's address, any port.
    refused(
        check_new_backends(&st, addr("10.0.0.20:80"), &[addr("10.0.0.10:80")], 1, &none),
        &[
            "VIP 10.0.0.20:80 backend 10.0.0.10:80: address: 10.0.0.10:80 is the address of VIP 10.0.0.10:80",
            "forwarding loop",
        ],
    );
    refused(
        check_new_backends(
            &st,
            addr("10.0.0.20:80"),
            &[addr("10.0.0.10:8080")],
            1,
            &none,
        ),
        &["10.0.0.10:8080", "VIP 10.0.0.10:80", "forwarding loop"],
    );
    // Its own VIP's address on another port.
    refused(
        check_new_backends(
            &st,
            addr("10.0.0.20:80"),
            &[addr("10.0.0.20:8080")],
            1,
            &none,
        ),
        &["VIP 10.0.0.20:80", "forwarding loop"],
    );
    assert!(check_new_backends(
        &st,
        addr("10.0.0.20:80"),
        &[addr("10.0.2.10:8080")],
        1,
        &none
    )
    .is_ok());
}

#[test]
fn a_vip_on_a_backends_address_is_a_loop() {
    let st = state(&[("10.0.0.20:80", &["10.0.2.10:8080"])]);
    let s = VipSettings::default();
    refused(
        check_new_vip(&st, addr("10.0.2.10:80"), &s, &host(&[])),
        &[
            "VIP 10.0.2.10:80: address: 10.0.2.10:80 is the address of backend 10.0.2.10:8080 of VIP 10.0.0.20:80",
            "forwarding loop",
        ],
    );
    assert!(check_new_vip(&st, addr("10.0.0.21:80"), &s, &host(&[])).is_ok());
    // A state file holding a loop is refused at start.
    let looped = state(&[
        ("10.0.0.10:80", &["10.0.0.20:80"]),
        ("10.0.0.20:80", &["10.0.0.10:80"]),
    ]);
    refused(looped.validate(), &["forwarding loop"]);
    assert!(st.validate().is_ok());
}

#[test]
fn the_hosts_addresses_need_saying_so() {
    let st = state(&[("10.0.0.20:80", &[])]);
    let h = host(&["10.0.1.1", "2001:db8:1::1"]);
    // A backend on the host: a loop, whatever the settings.
    refused(
        check_new_backends(&st, addr("10.0.0.20:80"), &[addr("10.0.1.1:8080")], 1, &h),
        &[
            "VIP 10.0.0.20:80 backend 10.0.1.1:8080: address",
            "own host",
            "forwarding loop",
        ],
    );
    // A VIP on the host: only with allow_host_address.
    let mut s = VipSettings::default();
    refused(
        check_new_vip(&st, addr("10.0.1.1:80"), &s, &h),
        &["VIP 10.0.1.1:80", "own host", "--allow-host-address"],
    );
    refused(
        check_new_vip(&st, addr("[2001:db8:1::1]:80"), &s, &h),
        &["own host"],
    );
    s.allow_host_address = true;
    assert!(check_new_vip(&st, addr("10.0.1.1:80"), &s, &h).is_ok());
    // Taking the permission back from a VIP on the host is refused.
    let mut on_host = state(&[("10.0.1.1:80", &[])]);
    on_host.vip_mut(&addr("10.0.1.1:80")).unwrap().settings = s.clone();
    let v = on_host.vip(&addr("10.0.1.1:80")).unwrap();
    refused(
        check_settings_change(v, &VipSettings::default(), &h),
        &["--allow-host-address"],
    );
    assert!(check_settings_change(v, &s, &h).is_ok());
}

#[test]
fn a_configuration_file_with_a_loop_is_refused() {
    let c = crate::model::config::parse(
        "[[vip]]\naddress = \"10.0.0.10:80\"\n[[vip.backend]]\naddress = \"10.0.0.20:80\"\n\
         [[vip]]\naddress = \"10.0.0.20:80\"\n[[vip.backend]]\naddress = \"10.0.0.10:80\"\n",
    )
    .unwrap();
    let e = check_config(&c).unwrap_err();
    let f = &e.refusal().expect("a refusal").field;
    assert_eq!(f.vip, Some(addr("10.0.0.10:80")));
    assert_eq!(f.backend, Some(addr("10.0.0.20:80")));
    assert_eq!(f.path, ["address"]);
    refused(
        check_config(&c),
        &["is the address of VIP 10.0.0.20:80", "forwarding loop"],
    );
    // allow_host_address round-trips through the file.
    let c = crate::model::config::parse(
        "[[vip]]\naddress = \"10.0.1.1:80\"\nallow_host_address = true\n",
    )
    .unwrap();
    assert!(c.vips[0].settings().allow_host_address);
    assert!(crate::model::config::to_toml(&c)
        .unwrap()
        .contains("allow_host_address = true"));
}

#[test]
fn consistent_candidates_only_in_the_tunnel_modes_and_through_the_file() {
    use crate::model::state::{Candidates, ForwardingMode};
    let consistent = |mode| VipSettings {
        mode,
        encap_source: Some("10.0.2.1".parse().unwrap()),
        candidates: Candidates::Consistent,
        ..VipSettings::default()
    };
    for mode in [ForwardingMode::Ipip, ForwardingMode::Gue] {
        consistent(mode).validate_for(addr("10.0.0.10:80")).unwrap();
    }
    for mode in [ForwardingMode::Nat, ForwardingMode::Dsr] {
        let s = VipSettings {
            encap_source: None,
            ..consistent(mode)
        };
        refused(
            s.validate_for(addr("10.0.0.10:80")),
            &["consistent candidates need an encapsulating mode"],
        );
    }
    // Control: random candidates are fine in every mode.
    VipSettings::default()
        .validate_for(addr("10.0.0.10:80"))
        .unwrap();
    let c = crate::model::config::parse(
        "[[vip]]\naddress = \"10.0.0.10:80\"\nmode = \"ipip\"\nencap_source = \"10.0.2.1\"\ncandidates = \"consistent\"\n",
    )
    .unwrap();
    assert_eq!(c.vips[0].settings().candidates, Candidates::Consistent);
    let text = crate::model::config::to_toml(&c).unwrap();
    assert!(text.contains("candidates = \"consistent\""), "{text}");
    // The default is not written out.
    let plain = crate::model::config::parse("[[vip]]\naddress = \"10.0.0.10:80\"\n").unwrap();
    assert!(!crate::model::config::to_toml(&plain)
        .unwrap()
        .contains("candidates"));
}

#[test]
fn udp_vips_through_the_file_and_their_refusals() {
    use crate::model::state::{HealthCheck, Protocol, DEFAULT_UDP_TIMEOUT};
    use std::time::Duration;
    let c = crate::model::config::parse(
        "[[vip]]\naddress = \"10.0.0.10:53\"\nprotocol = \"both\"\nudp_timeout = \"2m\"\n",
    )
    .unwrap();
    let s = c.vips[0].settings();
    assert_eq!(s.protocol, Protocol::Both);
    assert_eq!(s.udp_timeout, Duration::from_secs(120));
    let text = crate::model::config::to_toml(&c).unwrap();
    assert!(
        text.contains("protocol = \"both\"") && text.contains("udp_timeout = \"2m\""),
        "{text}"
    );
    // The defaults are not written out.
    let plain = crate::model::config::parse("[[vip]]\naddress = \"10.0.0.10:80\"\n").unwrap();
    assert_eq!(plain.vips[0].settings().udp_timeout, DEFAULT_UDP_TIMEOUT);
    let text = crate::model::config::to_toml(&plain).unwrap();
    assert!(
        !text.contains("protocol") && !text.contains("udp_timeout"),
        "{text}"
    );
    // An unknown protocol is refused by the file's parser.
    assert!(crate::model::config::parse(
        "[[vip]]\naddress = \"10.0.0.10:53\"\nprotocol = \"sctp\"\n"
    )
    .is_err());
    // A UDP timeout out of range, and a UDP-only VIP's TCP check on the
    // backends' own port, are refused; with a port of their own, accepted.
    let udp = |udp_timeout, health| VipSettings {
        protocol: Protocol::Udp,
        udp_timeout,
        health,
        ..VipSettings::default()
    };
    refused(
        udp(Duration::from_millis(500), None).validate_for(addr("10.0.0.10:53")),
        &["udp_timeout: 500ms is outside 1s..=7days"],
    );
    refused(
        udp(DEFAULT_UDP_TIMEOUT, Some(HealthCheck::default())).validate_for(addr("10.0.0.10:53")),
        &["--health-port"],
    );
    udp(
        DEFAULT_UDP_TIMEOUT,
        Some(HealthCheck {
            port: Some(8053),
            ..HealthCheck::default()
        }),
    )
    .validate_for(addr("10.0.0.10:53"))
    .unwrap();
    // Control: a TCP VIP's check on the backends' port is fine.
    VipSettings {
        health: Some(HealthCheck::default()),
        ..VipSettings::default()
    }
    .validate_for(addr("10.0.0.10:53"))
    .unwrap();
}

#[test]
fn udp_flow_timeouts_by_state() {
    use crate::datapath::gc::udp_timeout;
    use std::time::Duration;
    let t = Duration::from_secs(60);
    assert_eq!(udp_timeout(balancer_common::flow::F_ESTABLISHED, t), t);
    assert_eq!(udp_timeout(0, t), Duration::from_secs(5));
    // A VIP's timeout below the half-open one bounds both.
    let short = Duration::from_secs(2);
    assert_eq!(udp_timeout(0, short), short);
    assert_eq!(
        udp_timeout(balancer_common::flow::F_ESTABLISHED, short),
        short
    );
}
