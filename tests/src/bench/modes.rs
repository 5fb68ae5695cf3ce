//! Sections 1 and 2 for every forwarding mode and family: the data-path
//! cost of a pinned flow's ACK, a new-flow SYN and (NAT) a reply through
//! `BPF_PROG_TEST_RUN`, and the live-frame packet rate of the ACK path
//! next to a plain XDP_TX program (and a UDP NAT flow's datagram's), each
//! figure measured in this run by the method of the IPv4 NAT figures above
//! it.

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use anyhow::ensure;
use aya::programs::XdpMode;
use balancer::model::state::{ForwardingMode, VipSettings};
use serde_json::{json, Value};

use super::{
    arrivals, generate, generate_to_sink, median, r1, r2, time_path, Aux, Cost, Report, Scale,
};
use crate::{
    frames::{self, flags::*, Seg},
    netns::sh,
    rig::{
        self, backend, backend6, ifindex, many_client, test_run, Rig, Side, XDP_REDIRECT, XDP_TX,
    },
};

/// One mode and family.
#[derive(Clone, Copy)]
struct Case {
    mode: ForwardingMode,
    v6: bool,
    /// The data path writes flow events (as when the daemon syncs flows
    /// with peers: `SETTINGS_F_FLOW_EVENTS`).
    events: bool,
    /// Consistent candidates (`candidates = consistent`): the SYN's
    /// candidates come from its row instead of two random draws.
    consistent: bool,
}

impl Case {
    fn label(&self) -> String {
        let family = if self.v6 { "IPv6" } else { "IPv4" };
        match self.mode {
            ForwardingMode::Nat => format!("nat, {family}"),
            ForwardingMode::Dsr if self.events => {
                format!("dsr, {family}, flow events on (cluster sync)")
            }
            ForwardingMode::Dsr => format!("dsr, {family}"),
            ForwardingMode::Ipip if self.consistent => {
                format!("ipip, {family} in {family}, consistent candidates")
            }
            ForwardingMode::Ipip => format!("ipip, {family} in {family}"),
            ForwardingMode::Gue => format!("gue, {family} in UDP in {family}"),
        }
    }

    fn settings(&self, encap_v4: Ipv4Addr, encap_v6: Ipv6Addr) -> VipSettings {
        let encap = matches!(self.mode, ForwardingMode::Ipip | ForwardingMode::Gue);
        VipSettings {
            mode: self.mode,
            encap_source: encap.then_some(if self.v6 {
                IpAddr::V6(encap_v6)
            } else {
                IpAddr::V4(encap_v4)
            }),
            candidates: if self.consistent {
                balancer::model::state::Candidates::Consistent
            } else {
                balancer::model::state::Candidates::Random
            },
            ..VipSettings::default()
        }
    }
}

const CASES: [Case; 11] = [
    Case {
        mode: ForwardingMode::Nat,
        v6: false,
        events: false,
        consistent: false,
    },
    Case {
        mode: ForwardingMode::Nat,
        v6: true,
        events: false,
        consistent: false,
    },
    Case {
        mode: ForwardingMode::Dsr,
        v6: false,
        events: false,
        consistent: false,
    },
    Case {
        mode: ForwardingMode::Dsr,
        v6: true,
        events: false,
        consistent: false,
    },
    Case {
        mode: ForwardingMode::Dsr,
        v6: false,
        events: true,
        consistent: false,
    },
    Case {
        mode: ForwardingMode::Ipip,
        v6: false,
        events: false,
        consistent: false,
    },
    Case {
        mode: ForwardingMode::Ipip,
        v6: true,
        events: false,
        consistent: false,
    },
    Case {
        mode: ForwardingMode::Ipip,
        v6: false,
        events: false,
        consistent: true,
    },
    Case {
        mode: ForwardingMode::Ipip,
        v6: true,
        events: false,
        consistent: true,
    },
    Case {
        mode: ForwardingMode::Gue,
        v6: false,
        events: false,
        consistent: false,
    },
    Case {
        mode: ForwardingMode::Gue,
        v6: true,
        events: false,
        consistent: false,
    },
];

/// Backends per VIP: on-link ones (DSR needs them on the segment), the
/// rig's neighbour entries 10..=49.
const BACKENDS: u8 = 40;

/// The VIP of a case (the backends' port: DSR and the tunnels deliver the
/// packet unchanged).
fn vip(v6: bool) -> SocketAddr {
    if v6 {
        SocketAddr::new(
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10)),
            8080,
        )
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10)), 8080)
    }
}

/// Client `k` of a family, behind the client side's gateway.
fn client(v6: bool, k: u32) -> SocketAddr {
    let port = 1024 + (k % 60000) as u16;
    if v6 {
        rig::many_client6(k / 60000, port)
    } else {
        many_client(k / 60000, port)
    }
}

/// Section 1's figures for every case.
pub fn datapath(rep: &mut Report, aux: &Aux, sc: Scale) -> anyhow::Result<()> {
    let table = balancer_common::DEFAULT_FLOW_TABLE_SIZE;
    let mut md = String::new();
    let mut js = Vec::new();
    writeln!(md, "### Every forwarding mode and family\n")?;
    writeln!(md, "As above (one call per frame, {} frames, {} rounds, the same baseline), {BACKENDS} backends on the balancer's segment, table near empty, choices 2. The baseline parses IPv6 like IPv4.\n", sc.calls, sc.rounds)?;
    writeln!(
        md,
        "| mode, family | ACK of a pinned flow | new-flow SYN | reply (NAT) |\n|---|---|---|---|"
    )?;
    for case in CASES {
        let mut r = Rig::new(table)?;
        let v = vip(case.v6);
        r.lb.add_vip_with(
            v,
            case.settings(
                Ipv4Addr::new(10, 0, 2, 1),
                Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1),
            ),
        )?;
        let bs: Vec<SocketAddr> = (10..10 + BACKENDS)
            .map(|l| if case.v6 { backend6(l) } else { backend(l) })
            .collect();
        r.lb.add_backends(v, &bs)?;
        // Read between rounds, as the daemon does every 10 ms: a full
        // ring would time the lost-event path instead.
        let mut ring = if case.events {
            r.lb.take_flow_events()?
        } else {
            None
        };
        let mut drain = move || {
            if let Some(ring) = ring.as_mut() {
                balancer::cluster::sync::read_events(ring, usize::MAX);
            }
        };
        let mut pinned = Vec::new();
        for k in 0..sc.calls as u32 {
            let c = client(case.v6, k);
            let (a, out) = r.run(&Seg::new(c, v, SYN).build(), Side::Client)?;
            ensure!(
                a == XDP_REDIRECT || a == XDP_TX,
                "{}: SYN not forwarded ({a})",
                case.label()
            );
            // The backend: the NATed destination (the others' replies do
            // not come back through the balancer).
            let b = match case.mode {
                ForwardingMode::Nat => Some(frames::parse(&out)?.dst),
                _ => None,
            };
            pinned.push((c, b));
            // The handshake: in NAT the backend's SYN-ACK and the client's
            // ACK of it move the flow to the established table, where the
            // timed ACKs find it; in the direct-return modes the client's
            // ACK moves it to the unproven table, and its next segment
            // after the proof age (below) to the established one.
            if let Some(b) = b {
                r.run(&super::syn_ack(b, c).build(), Side::Backend)?;
            }
            r.run(&super::handshake_ack(c, v).build(), Side::Client)?;
        }
        let acks: Vec<Vec<u8>> = pinned
            .iter()
            .map(|(c, _)| super::handshake_ack(*c, v).build())
            .collect();
        if case.mode != ForwardingMode::Nat {
            std::thread::sleep(std::time::Duration::from_nanos(
                balancer_common::flow::PROOF_AGE_NS,
            ));
            for a in &acks {
                r.run(a, Side::Client)?;
            }
        }
        drain();
        let c_ack = time_path(&r, aux, Side::Client, sc.rounds, |_| acks.clone())?;
        let base = 2_000_000u32;
        let c_syn = time_path(&r, aux, Side::Client, sc.rounds, |round| {
            drain();
            (0..sc.calls as u32)
                .map(|i| {
                    let k = base + round as u32 * sc.calls as u32 + i;
                    Seg::new(client(case.v6, k), v, SYN).build()
                })
                .collect()
        })?;
        let c_reply = if case.mode == ForwardingMode::Nat {
            let replies: Vec<Vec<u8>> = pinned
                .iter()
                .filter_map(|(c, b)| {
                    let mut s = Seg::reply((*b)?, *c, ACK);
                    s.seq = 5001;
                    Some(s.build())
                })
                .collect();
            Some(time_path(&r, aux, Side::Backend, sc.rounds, |_| {
                replies.clone()
            })?)
        } else {
            None
        };
        let cell = |c: &Cost| format!("{:+.0} ns ({:.2}x)", c.added(), c.ratio());
        writeln!(
            md,
            "| {} | {} | {} | {} |",
            case.label(),
            cell(&c_ack),
            cell(&c_syn),
            c_reply.as_ref().map_or("(replies bypass it)".into(), cell)
        )?;
        js.push(json!({
            "mode": case.mode.name(), "ipv6": case.v6, "flow_events": case.events,
            "ack": c_ack.json(), "syn": c_syn.json(),
            "reply": c_reply.map(|c| c.json()),
        }));
    }
    writeln!(md)?;
    rep.section(1, &md);
    rep.json.insert("datapath_modes".into(), Value::Array(js));
    Ok(())
}

/// Section 2's figures for every case: the ACK path's rate on veth next
/// to a plain XDP_TX program with the same frame.
pub fn rate(rep: &mut Report, aux: &mut Aux, sc: Scale) -> anyhow::Result<()> {
    // The veth pairs of section 2 (gen0/lbin, lbout/sink) get IPv6 too.
    sh(
        "ip",
        &[
            "-6",
            "addr",
            "add",
            "2001:db8:9:1::1/64",
            "dev",
            "lbin",
            "nodad",
        ],
    )?;
    sh(
        "ip",
        &[
            "-6",
            "addr",
            "add",
            "2001:db8:9:2::1/64",
            "dev",
            "lbout",
            "nodad",
        ],
    )?;
    let sink = rig::mac_of("sink")?;
    rig::set_neigh("2001:db8:9:2::10".parse()?, sink, "lbout")?;
    rig::set_neigh("2001:db8:9:1::2".parse()?, [2, 0, 0, 0, 9, 2], "lbin")?;
    sh("sysctl", &["-q", "-w", "net.ipv6.conf.all.forwarding=1"])?;
    let gen = ifindex("gen0")?;
    let lbin_mac = rig::mac_of("lbin")?;
    let mut md = String::new();
    let mut js = Vec::new();
    writeln!(md, "### Every forwarding mode and family\n")?;
    writeln!(md, "As above, {} frames per run, median of {} runs; each mode's ACK (64 bytes for IPv4, 84 for IPv6) next to the plain XDP_TX program forwarding the same frame and a plain XDP_REDIRECT program sending it, unchanged, the balancer's way (lbin -> lbout -> sink), interleaved; then a UDP NAT flow's datagram of the same sizes (the flow promoted in the half-open table by its backend's answer and the client's next datagram). The balancer's programs are loaded as the daemon loads them for each configuration: with no feature at first, then the features the VIP asks for swapped in (`LoadOptions::features`).\n", sc.rate_frames, sc.rounds.min(3))?;
    writeln!(
        md,
        "| mode, family | balancer Mpps | XDP_TX Mpps | share of XDP_TX | XDP_REDIRECT Mpps | share of XDP_REDIRECT |\n|---|---|---|---|---|---|"
    )?;
    let mut notes = Vec::new();
    for case in CASES {
        let (vip, backend, client) = if case.v6 {
            (
                "[2001:db8:9::10]:8080",
                "[2001:db8:9:2::10]:8080",
                "[2001:db8:9:1::2]:40000",
            )
        } else {
            ("10.9.0.10:8080", "10.9.2.10:8080", "10.9.1.2:40000")
        };
        let (vip, backend, client): (SocketAddr, SocketAddr, SocketAddr) =
            (vip.parse()?, backend.parse()?, client.parse()?);
        let mut lb = balancer::Balancer::load(&specialised())?;
        lb.add_vip_with(
            vip,
            case.settings(Ipv4Addr::new(10, 9, 2, 1), "2001:db8:9:2::1".parse()?),
        )?;
        lb.add_backend(vip, backend)?;
        lb.register_interface("lbin")?;
        let mut syn = Seg::new(client, vip, SYN);
        syn.dmac = lbin_mac;
        let (a, _, _) = test_run(lb.program()?, &syn.build(), ifindex("lbin")?)?;
        ensure!(
            a == XDP_REDIRECT,
            "{}: SYN not redirected ({a})",
            case.label()
        );
        // The handshake, so that the timed ACK is an established flow's
        // (see the per-packet section above).
        let mut hs = super::handshake_ack(client, vip);
        hs.dmac = lbin_mac;
        if case.mode == ForwardingMode::Nat {
            let mut sa = super::syn_ack(backend, client);
            sa.dmac = lbin_mac;
            test_run(lb.program()?, &sa.build(), ifindex("lbin")?)?;
        } else {
            test_run(lb.program()?, &hs.build(), ifindex("lbin")?)?;
            std::thread::sleep(std::time::Duration::from_nanos(
                balancer_common::flow::PROOF_AGE_NS,
            ));
        }
        let mut ack = hs;
        ack.payload = vec![0x42; 10];
        let (m, c, r) = rate_row(
            aux,
            &mut lb,
            &ack.build(),
            gen,
            sc,
            &case.label(),
            &mut notes,
        )?;
        writeln!(
            md,
            "| {} | {m:.2} | {c:.2} | {:.0} % | {r:.2} | {:.0} % |",
            case.label(),
            100.0 * m / c,
            100.0 * m / r
        )?;
        js.push(json!({"mode": case.mode.name(), "ipv6": case.v6, "mpps": r2(m), "xdp_tx_mpps": r2(c), "share": r1(100.0 * m / c), "xdp_redirect_mpps": r2(r), "share_redirect": r1(100.0 * m / r)}));
    }
    // UDP (issue 23): a NAT flow's datagram of the same size as the ACK
    // above (22 bytes of payload: 64-byte frames for IPv4, 84 for IPv6),
    // the flow promoted to the established table first (its backend
    // answered, then the client sent again).
    for v6 in [false, true] {
        use crate::fixtures::udp::Dgram;
        let label = format!(
            "udp, nat, {}: a pinned flow's datagram",
            if v6 { "IPv6" } else { "IPv4" }
        );
        let (vip, backend, client) = if v6 {
            (
                "[2001:db8:9::10]:8053",
                "[2001:db8:9:2::10]:8053",
                "[2001:db8:9:1::2]:40000",
            )
        } else {
            ("10.9.0.10:8053", "10.9.2.10:8053", "10.9.1.2:40000")
        };
        let (vip, backend, client): (SocketAddr, SocketAddr, SocketAddr) =
            (vip.parse()?, backend.parse()?, client.parse()?);
        let mut lb = balancer::Balancer::load(&specialised())?;
        lb.add_vip_with(
            vip,
            VipSettings {
                protocol: balancer::model::state::Protocol::Udp,
                ..VipSettings::default()
            },
        )?;
        lb.add_backend(vip, backend)?;
        lb.register_interface("lbin")?;
        let mut d = Dgram::new(client, vip, &[0x42; 22]);
        d.dmac = lbin_mac;
        let mut answer = Dgram::reply(backend, client, b"answer");
        answer.dmac = lbin_mac;
        for f in [&d, &answer, &d] {
            let (a, _, _) = test_run(lb.program()?, &f.build(), ifindex("lbin")?)?;
            // The answer goes back out of lbin, where the client is.
            ensure!(
                a == XDP_REDIRECT || a == XDP_TX,
                "{label}: set-up frame not forwarded ({a})"
            );
        }
        let st = lb.stats()?;
        ensure!(
            st.counters.get("udp_promoted").copied() == Some(1),
            "{label}: the flow was not promoted"
        );
        let (m, c, r) = rate_row(aux, &mut lb, &d.build(), gen, sc, &label, &mut notes)?;
        writeln!(
            md,
            "| {label} | {m:.2} | {c:.2} | {:.0} % | {r:.2} | {:.0} % |",
            100.0 * m / c,
            100.0 * m / r
        )?;
        js.push(json!({"mode": "nat", "protocol": "udp", "ipv6": v6, "mpps": r2(m), "xdp_tx_mpps": r2(c), "share": r1(100.0 * m / c), "xdp_redirect_mpps": r2(r), "share_redirect": r1(100.0 * m / r)}));
    }
    if notes.is_empty() {
        writeln!(md, "\nEvery run's sink counted exactly the frames sent.")?;
    } else {
        writeln!(md, "\nRuns whose sink did not count exactly the frames sent (frames at the sink; the rate above counts only the flow's):\n")?;
        for n in &notes {
            writeln!(md, "- {n}")?;
        }
    }
    writeln!(md)?;
    rep.section(2, &md);
    rep.json
        .insert("packet_rate_modes".into(), Value::Array(js));
    rep.json
        .insert("packet_rate_modes_strays".into(), json!(notes));
    Ok(())
}

/// Section 2's rate of `frame` (a flow `lb` has pinned) through `lb` on
/// lbin, next to the plain XDP_TX program forwarding it and a plain
/// XDP_REDIRECT program sending it the balancer's way, interleaved,
/// `sc.rounds.min(3)` runs: the medians (balancer, XDP_TX, XDP_REDIRECT),
/// Mpps. A run whose sink did not count exactly the frames sent is noted
/// in `notes` under `label`.
fn rate_row(
    aux: &mut Aux,
    lb: &mut balancer::Balancer,
    frame: &[u8],
    gen: u32,
    sc: Scale,
    label: &str,
    notes: &mut Vec<String>,
) -> anyhow::Result<(f64, f64, f64)> {
    aux.set_template(frame, frame)?;
    let (mut ours, mut ceiling, mut redirect) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..sc.rounds.min(3) {
        lb.attach("lbin", XdpMode::Driver)?;
        let sink_link = aux
            .prog_mut("bench_count")?
            .attach("sink", XdpMode::Driver)?;
        // The sink counts every frame reaching it: lbout's own stack's
        // (taken off and named) as well as the generator's flow.
        let (n, secs, strays) = generate_to_sink(aux, frame, gen, sc.rate_frames)?;
        let flow = n.saturating_sub(strays.len() as u64);
        if !strays.is_empty() || flow != u64::from(sc.rate_frames) {
            notes.push(format!("{label}: {}", arrivals(n, sc.rate_frames, &strays)));
        }
        ours.push(flow as f64 / secs / 1e6);
        aux.prog_mut("bench_count")?.detach(sink_link)?;
        lb.detach_all()?;
        let tx = aux.prog_mut("bench_tx")?.attach("lbin", XdpMode::Driver)?;
        let back = aux
            .prog_mut("bench_count")?
            .attach("gen0", XdpMode::Driver)?;
        let (n2, secs2) = generate(aux, frame, gen, sc.rate_frames)?;
        ceiling.push(n2 as f64 / secs2 / 1e6);
        aux.prog_mut("bench_count")?.detach(back)?;
        aux.prog_mut("bench_tx")?.detach(tx)?;
        let (n3, secs3, strays3) = super::redirect_ceiling(aux, frame, gen, sc.rate_frames)?;
        redirect.push(n3.saturating_sub(strays3.len() as u64) as f64 / secs3 / 1e6);
    }
    Ok((median(ours), median(ceiling), median(redirect)))
}

/// The balancer loaded as the daemon loads it: no feature at first, the
/// features each VIP asks for loaded and swapped in when it is added
/// (`LoadOptions::features`), so that a mode's rate is that of the programs
/// its configuration runs.
pub(crate) fn specialised() -> balancer::LoadOptions {
    balancer::LoadOptions {
        features: Some(0),
        ..balancer::LoadOptions::default()
    }
}
