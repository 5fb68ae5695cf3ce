//! The shipped alerting rules (contrib/prometheus/alerts.yml) evaluated by
//! `promtool test rules` against the series of a real scrape of the
//! daemon's `/metrics`, so that a series renamed in the daemon or in the
//! rules fails a test instead of silently disarming an alert. The package
//! test (tests/tests/package.rs) runs it on a scrape of the installed
//! daemon started with the package's defaults.
//!
//! From the scrape and the rules, [`check`]:
//!
//! - reads every alert's `expr` and the selectors it names (`name{label="value"}`);
//!   each must match a series of the scrape, or the check fails naming the
//!   alert and the selector. `up{instance, job}` is the series Prometheus
//!   itself records for a scrape that answered (value 1). The `cluster_*`
//!   series exist only on a daemon in a cluster: on a scrape without any,
//!   an alert naming them is skipped and listed in the [`Report`];
//! - writes a `promtool test rules` file whose input series are every
//!   series of the scrape (with the `instance` and `job` labels a scrape
//!   job adds), constant for 40 minutes, and, for every alert: each
//!   selector returns exactly the scraped samples it matches; the value the
//!   alert compares (the expression without its final `OP NUMBER`, which
//!   every rule ends with) is not empty, so the selectors' series also
//!   match one another (an operand with a label the other lacks would give
//!   nothing); and the whole expression returns nothing and the alert does
//!   not fire, the scrape being of a healthy daemon;
//! - runs `promtool check rules` (its rule count must be the number of
//!   alerts read, so none was missed) and `promtool test rules` on it.

use std::{fmt::Write as _, path::Path, process::Command};

use anyhow::{bail, ensure, Context, Result};

/// The scrape job's name the rules expect (`up{job="p2c-balancer"}`).
pub const JOB: &str = "p2c-balancer";

/// Prefix of the series only a daemon in a cluster exports.
const CLUSTER_PREFIX: &str = "p2c_balancer_cluster_";

/// One sample of a scrape: the series' name, its labels (values as the
/// exposition escapes them, which PromQL strings read alike) and its value
/// as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric's name.
    pub name: String,
    /// Its labels, in the scrape's order.
    pub labels: Vec<(String, String)>,
    /// Its value, as the exposition wrote it.
    pub value: String,
}

impl Sample {
    /// The series in PromQL's notation, `name{label="value",...}`.
    pub fn series(&self) -> String {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect();
        format!("{}{{{}}}", self.name, labels.join(","))
    }
}

/// The samples of a Prometheus text (or OpenMetrics) exposition; comments,
/// `# EOF` and blank lines are skipped.
pub fn parse_scrape(text: &str) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_sample(line).with_context(|| format!("scrape line {}: {line}", n + 1))?);
    }
    Ok(out)
}

fn parse_sample(line: &str) -> Result<Sample> {
    let end = line
        .find(['{', ' '])
        .context("no value after the series' name")?;
    let name = line[..end].to_string();
    ensure!(is_ident(&name), "{name:?} is not a metric name");
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (ls, tail) = parse_labels(after)?;
        labels = ls;
        rest = tail;
    }
    let value = rest
        .split_whitespace()
        .next()
        .context("no value")?
        .to_string();
    let v: f64 = value
        .parse()
        .with_context(|| format!("value {value:?} is not a number"))?;
    ensure!(v.is_finite(), "value {value} is not finite");
    Ok(Sample {
        name,
        labels,
        value,
    })
}

/// `label="value",...}` and what follows the brace.
fn parse_labels(mut s: &str) -> Result<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(tail) = s.strip_prefix('}') {
            return Ok((labels, tail));
        }
        let eq = s.find('=').context("a label without '='")?;
        let key = s[..eq].trim().to_string();
        ensure!(is_ident(&key), "{key:?} is not a label name");
        let (value, tail) = quoted(s[eq + 1..].trim_start())?;
        labels.push((key, value));
        s = tail;
    }
}

/// A double-quoted string at the start of `s`: its content (escapes kept)
/// and what follows it.
fn quoted(s: &str) -> Result<(String, &str)> {
    let body = s.strip_prefix('"').context("a label value without '\"'")?;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Ok((body[..i].to_string(), &body[i + 1..])),
            _ => {}
        }
    }
    bail!("an unterminated label value")
}

fn is_ident(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// An alerting rule: its name and expression.
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    /// `alert:`.
    pub name: String,
    /// `expr:`, a folded block joined into one line.
    pub expr: String,
}

/// The alerts of a rules file written as contrib/prometheus/alerts.yml is:
/// `- alert: NAME` and its `expr:`, on one line or as a folded block
/// (`expr: >`). Anything else is ignored; an alert without an `expr` is an
/// error.
pub fn parse_alerts(yaml: &str) -> Result<Vec<Alert>> {
    let mut out: Vec<Alert> = Vec::new();
    let mut lines = yaml.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if let Some(name) = t.strip_prefix("- alert:") {
            if let Some(last) = out.last() {
                ensure!(!last.expr.is_empty(), "alert {} has no expr", last.name);
            }
            out.push(Alert {
                name: unquote(name.trim())?,
                expr: String::new(),
            });
        } else if let Some(v) = t.strip_prefix("expr:") {
            let alert = out.last_mut().context("an expr before any alert")?;
            let v = v.trim();
            alert.expr = if matches!(v, ">" | ">-" | "|" | "|-") {
                let indent = line.len() - t.len();
                let mut parts = Vec::new();
                while let Some(next) = lines.peek() {
                    let nt = next.trim_start();
                    if !nt.is_empty() && next.len() - nt.len() <= indent {
                        break;
                    }
                    parts.push(nt.trim_end());
                    lines.next();
                }
                parts.retain(|p| !p.is_empty());
                parts.join(" ")
            } else {
                unquote(v)?
            };
            ensure!(
                !alert.expr.is_empty(),
                "alert {} has an empty expr",
                alert.name
            );
        }
    }
    if let Some(last) = out.last() {
        ensure!(!last.expr.is_empty(), "alert {} has no expr", last.name);
    }
    Ok(out)
}

/// A YAML scalar without its quotes (no escapes in double quotes).
fn unquote(v: &str) -> Result<String> {
    if let Some(inner) = v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        return Ok(inner.replace("''", "'"));
    }
    if let Some(inner) = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        ensure!(!inner.contains('\\'), "escapes in {v} are not read here");
        return Ok(inner.to_string());
    }
    Ok(v.to_string())
}

/// A label matcher of a selector: `label="value"` or `label!="value"`.
#[derive(Clone, Debug, PartialEq)]
pub struct Matcher {
    /// The label.
    pub label: String,
    /// `true` for `=`, `false` for `!=`.
    pub equal: bool,
    /// The value, escapes kept.
    pub value: String,
}

/// A series selector of an expression: a name and its matchers.
#[derive(Clone, Debug, PartialEq)]
pub struct Selector {
    /// The metric's name.
    pub name: String,
    /// Its label matchers.
    pub matchers: Vec<Matcher>,
}

impl Selector {
    /// The selector in PromQL's notation.
    pub fn promql(&self) -> String {
        let ms: Vec<String> = self
            .matchers
            .iter()
            .map(|m| {
                format!(
                    "{}{}\"{}\"",
                    m.label,
                    if m.equal { "=" } else { "!=" },
                    m.value
                )
            })
            .collect();
        if ms.is_empty() {
            self.name.clone()
        } else {
            format!("{}{{{}}}", self.name, ms.join(","))
        }
    }

    /// Whether `s` is a series this selector selects.
    pub fn selects(&self, s: &Sample) -> bool {
        s.name == self.name
            && self.matchers.iter().all(|m| {
                let v = s
                    .labels
                    .iter()
                    .find(|(k, _)| *k == m.label)
                    .map_or("", |(_, v)| v.as_str());
                (v == m.value) == m.equal
            })
    }
}

/// PromQL words that are not series: keywords and modifiers.
const KEYWORDS: [&str; 11] = [
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The series selectors of a PromQL expression, in order. Every one must
/// be named `p2c_balancer_*` or `up` (the rules' convention, which keeps
/// this reader small); regular-expression matchers are refused.
pub fn selectors(expr: &str) -> Result<Vec<Selector>> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if c == '"' || c == '\'' {
            let end = expr[i + 1..]
                .find(c)
                .with_context(|| format!("an unterminated string in {expr}"))?;
            i += end + 2;
        } else if c == '[' {
            i += expr[i..].find(']').context("an unterminated range")? + 1;
        } else if c == '{' {
            bail!("a selector without a name in {expr}");
        } else if c.is_ascii_digit() || c == '.' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            let word = &expr[start..i];
            let next = expr[i..].trim_start();
            if KEYWORDS.contains(&word) {
                if next.starts_with('(') {
                    // A label list: by (...), on (...), group_left (...).
                    let skip = expr[i..].find(')').context("an unterminated label list")?;
                    i += skip + 1;
                }
            } else if next.starts_with('(') {
                // A function: its arguments are read on.
            } else {
                ensure!(
                    word == "up" || word.starts_with("p2c_balancer_"),
                    "{word} in {expr} is neither p2c_balancer_* nor up"
                );
                let mut sel = Selector {
                    name: word.to_string(),
                    matchers: Vec::new(),
                };
                if let Some(after) = next.strip_prefix('{') {
                    let at = expr.len() - after.len();
                    let close = after.find('}').context("an unterminated selector")?;
                    sel.matchers = parse_matchers(&after[..close])
                        .with_context(|| format!("the matchers of {word} in {expr}"))?;
                    i = at + close + 1;
                }
                out.push(sel);
            }
        } else {
            i += c.len_utf8();
        }
    }
    Ok(out)
}

fn parse_matchers(s: &str) -> Result<Vec<Matcher>> {
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if rest.is_empty() {
            return Ok(out);
        }
        let at = rest
            .find(['=', '!'])
            .context("a matcher without an operator")?;
        let label = rest[..at].trim().to_string();
        let after = &rest[at..];
        let (equal, after) = if let Some(a) = after.strip_prefix("!=") {
            (false, a)
        } else if let Some(a) = after.strip_prefix('=') {
            ensure!(
                !a.starts_with('~'),
                "regular-expression matchers are not read here"
            );
            (true, a)
        } else {
            bail!("regular-expression matchers are not read here");
        };
        let (value, tail) = quoted(after.trim_start())?;
        out.push(Matcher {
            label,
            equal,
            value,
        });
        rest = tail;
    }
}

/// The value an alert's expression compares: the expression without its
/// final `OP NUMBER`. Refused when the expression does not end in one, or
/// when what is left still compares or combines sets (`and`, `or`,
/// `unless`), since its result would then depend on the values.
pub fn value_part(expr: &str) -> Result<String> {
    let e = expr.trim_end();
    let num_at = e
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '+' || c == '-'))
        .map_or(0, |p| p + 1);
    let number = &e[num_at..];
    ensure!(
        number.parse::<f64>().is_ok(),
        "{expr} does not end in a number"
    );
    let before = e[..num_at].trim_end();
    let value = [">=", "<=", "==", "!=", ">", "<"]
        .iter()
        .find_map(|op| before.strip_suffix(op))
        .with_context(|| format!("{expr} does not end in a comparison with a number"))?
        .trim_end();
    let bare = strip_quoted_and_braces(value);
    ensure!(
        !bare.contains(['<', '>']) && !bare.contains("==") && !bare.contains("!="),
        "{expr}: what it compares compares again"
    );
    ensure!(
        !bare
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|w| matches!(w, "and" | "or" | "unless")),
        "{expr}: what it compares combines sets"
    );
    Ok(value.to_string())
}

/// `s` without its strings and label matchers.
fn strip_quoted_and_braces(s: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    let mut quote = None;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '{') => depth += 1,
            (None, '}') => depth -= 1,
            (None, _) if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// What [`check`] checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// The alerts evaluated against the scrape's series.
    pub checked: Vec<String>,
    /// The alerts skipped, with why (cluster series on a daemon outside a
    /// cluster).
    pub skipped: Vec<(String, String)>,
    /// Selectors checked, over all alerts.
    pub selectors: usize,
    /// Series of the scrape given to promtool.
    pub series: usize,
}

/// Quoted for a single-quoted YAML scalar.
fn yq(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The `promtool test rules` file for `alerts` (read from `rules_file`)
/// against `scrape`, a scrape of `target` by the job [`JOB`], and what it
/// covers. Fails, naming the alert, when a selector matches no series of
/// the scrape.
pub fn generate(
    alerts: &[Alert],
    scrape: &[Sample],
    target: &str,
    rules_file: &str,
) -> Result<(String, Report)> {
    // The series as Prometheus stores them: the job's labels added, and
    // `up` for the scrape itself.
    let mut series: Vec<Sample> = scrape
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.labels.retain(|(k, _)| k != "instance" && k != "job");
            s.labels.push(("instance".into(), target.into()));
            s.labels.push(("job".into(), JOB.into()));
            s
        })
        .collect();
    series.push(Sample {
        name: "up".into(),
        labels: vec![
            ("instance".into(), target.into()),
            ("job".into(), JOB.into()),
        ],
        value: "1".into(),
    });
    let in_cluster = scrape.iter().any(|s| s.name.starts_with(CLUSTER_PREFIX));
    let mut report = Report {
        series: series.len(),
        ..Report::default()
    };
    let mut tests = String::new();
    let mut alert_tests = String::new();
    let at = "30m";
    'alerts: for a in alerts {
        let sels = selectors(&a.expr).with_context(|| format!("alert {}", a.name))?;
        ensure!(!sels.is_empty(), "alert {} names no series", a.name);
        let value = value_part(&a.expr).with_context(|| format!("alert {}", a.name))?;
        let mut checks = String::new();
        for sel in &sels {
            let hits: Vec<&Sample> = series.iter().filter(|s| sel.selects(s)).collect();
            if hits.is_empty() {
                if sel.name.starts_with(CLUSTER_PREFIX) && !in_cluster {
                    report.skipped.push((
                        a.name.clone(),
                        format!("{} exists only on a daemon in a cluster", sel.promql()),
                    ));
                    continue 'alerts;
                }
                bail!(
                    "alert {}: {} matches no series of the scrape of {target} (renamed in the daemon or in the rules?)",
                    a.name,
                    sel.promql()
                );
            }
            let _ = write!(
                checks,
                "      - expr: {}\n        eval_time: {at}\n        exp_samples:\n",
                yq(&sel.promql())
            );
            for s in hits {
                let _ = write!(
                    checks,
                    "          - labels: {}\n            value: {}\n",
                    yq(&s.series()),
                    s.value
                );
            }
        }
        report.selectors += sels.len();
        let _ = write!(
            tests,
            "      # {}\n{checks}      - expr: {}\n        eval_time: {at}\n        exp_samples:\n          - labels: '{{}}'\n            value: 1\n      - expr: {}\n        eval_time: {at}\n        exp_samples: []\n",
            a.name,
            yq(&format!("count({value}) > bool 0")),
            yq(&a.expr),
        );
        let _ = write!(
            alert_tests,
            "      - eval_time: {at}\n        alertname: {}\n        exp_alerts: []\n",
            a.name
        );
        report.checked.push(a.name.clone());
    }
    let mut out = format!(
        "# Generated by balancer_tests::scraped_rules from a scrape of {target}.\nrule_files:\n  - {rules_file}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n"
    );
    for s in &series {
        let _ = write!(
            out,
            "      - series: {}\n        values: '{}+0x40'\n",
            yq(&s.series()),
            s.value
        );
    }
    let _ = write!(
        out,
        "    promql_expr_test:\n{tests}    alert_rule_test:\n{alert_tests}"
    );
    Ok((out, report))
}

fn promtool(dir: &Path, args: &[&str]) -> Result<(bool, String)> {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .context("promtool (scripts/setup.sh installs Debian's prometheus package)")?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

/// Checks the rules `alerts_yml` against `scrape`, the text of a scrape of
/// `target` (`ADDR:PORT`), in `dir` (an empty directory): the selectors,
/// then `promtool check rules` and `promtool test rules` on the generated
/// tests (see the module's description).
pub fn check(alerts_yml: &str, scrape: &str, target: &str, dir: &Path) -> Result<Report> {
    let alerts = parse_alerts(alerts_yml)?;
    ensure!(!alerts.is_empty(), "no alert in the rules");
    std::fs::write(dir.join("alerts.yml"), alerts_yml)?;
    let (ok, out) = promtool(dir, &["check", "rules", "alerts.yml"])?;
    ensure!(ok, "promtool check rules:\n{out}");
    let want = format!("SUCCESS: {} rules found", alerts.len());
    ensure!(
        out.contains(&want),
        "promtool counts other rules than the {} alerts read ({}):\n{out}",
        alerts.len(),
        alerts
            .iter()
            .map(|a| a.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let samples = parse_scrape(scrape)?;
    let (tests, report) = generate(&alerts, &samples, target, "alerts.yml")?;
    std::fs::write(dir.join("scrape-test.yml"), &tests)?;
    let (ok, out) = promtool(dir, &["test", "rules", "scrape-test.yml"])?;
    ensure!(
        ok,
        "promtool test rules on the scrape's series (tests in {}):\n{out}",
        dir.join("scrape-test.yml").display()
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules as shipped.
    const RULES: &str = include_str!("../../contrib/prometheus/alerts.yml");

    /// Part of a scrape of the debug daemon with one VIP and its backend
    /// (`--health off`), as the package test makes: every series the rules
    /// name, and some of the others.
    const SCRAPE: &str = r#"# HELP p2c_balancer_backend_ejected 1 while passive detection keeps the backend's server out of the choices.
# TYPE p2c_balancer_backend_ejected gauge
p2c_balancer_backend_ejected{vip="10.9.0.100:80",backend="10.9.0.2:80"} 0.0
p2c_balancer_backend_draining{vip="10.9.0.100:80",backend="10.9.0.2:80"} 0.0
p2c_balancer_backend_health{vip="10.9.0.100:80",backend="10.9.0.2:80",status="unhealthy"} 0.0
p2c_balancer_backend_health{vip="10.9.0.100:80",backend="10.9.0.2:80",status="healthy"} 0.0
p2c_balancer_backend_health{vip="10.9.0.100:80",backend="10.9.0.2:80",status="unknown"} 0.0
p2c_balancer_backend_health{vip="10.9.0.100:80",backend="10.9.0.2:80",status="unchecked"} 1.0
p2c_balancer_backend_health_checks_total{vip="10.9.0.100:80",backend="10.9.0.2:80"} 0
p2c_balancer_vip_eligible_backends{vip="10.9.0.100:80"} 1.0
p2c_balancer_dropped_packets_total{reason="mtu"} 0
p2c_balancer_dropped_packets_total{reason="no_backend"} 0
p2c_balancer_dropped_packets_total{reason="fib"} 0
p2c_balancer_passed_packets_total{reason="fib_no_neigh"} 0
p2c_balancer_passed_packets_total{reason="not_vip"} 0
p2c_balancer_rx_packets_total 12
p2c_balancer_flow_table_entries 0
p2c_balancer_half_open_entries 0
p2c_balancer_flow_table_size 524288
p2c_balancer_state_file_unsaved 0
p2c_balancer_gc_pass_duration_seconds_sum 0.0
p2c_balancer_gc_pass_duration_seconds_count 0
p2c_balancer_gc_pass_duration_seconds_bucket{le="0.0001"} 0
p2c_balancer_gc_pass_duration_seconds_bucket{le="+Inf"} 0
p2c_balancer_attached{interface="veth0",mode="generic"} 1.0
p2c_balancer_build_info{version="0.1.0",commit="c27ee8b616e5",fingerprint="d7f5cbf5e9087a4c"} 1.0
# EOF
"#;

    const TARGET: &str = "127.0.0.1:9464";

    fn run(rules: &str, scrape: &str) -> Result<Report> {
        let dir = tempfile::tempdir().unwrap();
        check(rules, scrape, TARGET, dir.path())
    }

    fn fails(rules: &str, scrape: &str) -> String {
        match run(rules, scrape) {
            Ok(r) => panic!("control passed: {r:?}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn the_rules_evaluate_on_a_healthy_daemons_series() {
        let r = run(RULES, SCRAPE).unwrap();
        assert_eq!(r.checked.len(), 9, "{r:?}");
        assert_eq!(r.skipped.len(), 1, "{r:?}");
        assert_eq!(r.skipped[0].0, "BalancerClusterSyncStale");
        // The series and `up`.
        assert_eq!(r.series, 25);
    }

    #[test]
    fn in_a_cluster_the_clusters_alert_is_evaluated_too() {
        let scrape = SCRAPE.replace(
            "# EOF",
            "p2c_balancer_cluster_peer_last_heard_seconds{peer=\"10.0.9.12:7946\"} 0.1\n# EOF",
        );
        let r = run(RULES, &scrape).unwrap();
        assert_eq!(r.checked.len(), 10, "{r:?}");
        assert!(r.skipped.is_empty(), "{r:?}");
    }

    #[test]
    fn control_a_series_renamed_in_the_rules_fails() {
        let rules = RULES.replace(
            "p2c_balancer_backend_ejected",
            "p2c_balancer_backend_ejected_now",
        );
        let err = fails(&rules, SCRAPE);
        assert!(
            err.contains(
                "alert BalancerBackendEjected: p2c_balancer_backend_ejected_now matches no series"
            ),
            "{err}"
        );
        // A label value too.
        let rules = RULES.replace("reason=\"fib\"", "reason=\"fib_lookup\"");
        let err = fails(&rules, SCRAPE);
        assert!(err.contains("BalancerDropFib"), "{err}");
    }

    #[test]
    fn control_a_series_renamed_in_the_daemon_fails() {
        let scrape = SCRAPE.replace(
            "p2c_balancer_backend_health{",
            "p2c_balancer_backend_status{",
        );
        let err = fails(RULES, &scrape);
        assert!(err.contains("BalancerBackendUnhealthy"), "{err}");
    }

    #[test]
    fn control_a_label_on_one_operand_fails_in_promtool() {
        // Every selector still matches; the flow table's ratio is empty.
        let scrape = SCRAPE.replace(
            "\np2c_balancer_flow_table_size ",
            "\np2c_balancer_flow_table_size{table=\"flows\"} ",
        );
        let err = fails(RULES, &scrape);
        assert!(err.contains("promtool test rules"), "{err}");
        assert!(err.contains("p2c_balancer_flow_table_size"), "{err}");
    }

    #[test]
    fn control_an_unhealthy_backend_is_not_a_healthy_daemon() {
        // The alerts' expressions are evaluated on the values: an unhealthy
        // backend's series make BalancerBackendUnhealthy's return it.
        let scrape = SCRAPE
            .replace("status=\"unhealthy\"} 0.0", "status=\"unhealthy\"} 1.0")
            .replace("status=\"unchecked\"} 1.0", "status=\"unchecked\"} 0.0");
        let err = fails(RULES, &scrape);
        assert!(err.contains("promtool test rules"), "{err}");
        assert!(err.contains("BalancerBackendUnhealthy"), "{err}");
    }

    #[test]
    fn reads_selectors_values_and_alerts() {
        let s = selectors(
            "max_over_time(p2c_balancer_backend_ejected[2m]) * ignoring(status) (1 - p2c_balancer_backend_draining{vip!=\"a\"}) == 1",
        )
        .unwrap();
        let names: Vec<String> = s.iter().map(Selector::promql).collect();
        assert_eq!(
            names,
            [
                "p2c_balancer_backend_ejected",
                "p2c_balancer_backend_draining{vip!=\"a\"}"
            ]
        );
        assert_eq!(
            selectors("up{job=\"x\"} == 0").unwrap()[0].promql(),
            "up{job=\"x\"}"
        );
        assert!(selectors("node_load1 > 1").is_err());
        assert!(selectors("up{job=~\"x\"} == 0").is_err());
        assert_eq!(value_part("(a - b) / c > 0.9").unwrap(), "(a - b) / c");
        assert_eq!(
            value_part("rate(x{r=\"f\"}[5m]) > 0").unwrap(),
            "rate(x{r=\"f\"}[5m])"
        );
        assert!(value_part("a == 1 unless b == 1").is_err());
        assert!(value_part("a > b").is_err());
        let alerts = parse_alerts(RULES).unwrap();
        assert_eq!(alerts.len(), 10);
        let ratio = alerts
            .iter()
            .find(|a| a.name == "BalancerFlowTableNearFull")
            .unwrap();
        assert_eq!(
            ratio.expr,
            "(p2c_balancer_flow_table_entries - p2c_balancer_half_open_entries) / p2c_balancer_flow_table_size > 0.9"
        );
        let s = parse_scrape(SCRAPE).unwrap();
        assert_eq!(s.len(), 24);
        assert_eq!(
            s.last().unwrap().series(),
            "p2c_balancer_build_info{version=\"0.1.0\",commit=\"c27ee8b616e5\",fingerprint=\"d7f5cbf5e9087a4c\"}"
        );
    }
}
