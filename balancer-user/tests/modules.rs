//! The house rule of balancer-user's library: its modules import each other
//! without a circle, so each can be read, and tested, with only the ones
//! below it (model types at the bottom, services at the top). Imports are
//! read from the source: `crate::module` paths, `use crate::{...}` trees,
//! and the crate root's re-exports (`crate::Balancer` is `balancer`'s).
//! Test modules (`#[cfg(test)] mod tests`) may reach anywhere.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// The module of each item the crate root re-exports.
const ROOT_ITEMS: [(&str, &str); 7] = [
    ("Balancer", "balancer"),
    ("LoadOptions", "balancer"),
    ("PROGRAM", "balancer"),
    ("BalancerError", "error"),
    ("Result", "error"),
    ("Timeouts", "state"),
    ("State", "state"),
];

/// The module's code without comment lines and its test module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(k) => &text[..k],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Names used right after `crate::`, and the first segment of every path
/// in a `use crate::{...}` tree.
fn imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (k, _) in code.match_indices("crate::") {
        let rest = &code[k + "crate::".len()..];
        if let Some(tree) = rest.strip_prefix('{') {
            // Depth-1 names of the tree.
            let mut depth = 1;
            let mut at_start = true;
            let mut i = 0;
            let b = tree.as_bytes();
            while depth > 0 && i < b.len() {
                match b[i] {
                    b'{' => depth += 1,
                    b'}' => depth -= 1,
                    b',' if depth == 1 => at_start = true,
                    c if depth == 1 && at_start && (c.is_ascii_alphanumeric() || c == b'_') => {
                        out.insert(ident(&tree[i..]));
                        at_start = false;
                    }
                    _ => {}
                }
                i += 1;
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out
}

/// A circle of imports, if any (depth-first search).
fn circle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        v: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == v) {
            let mut c = path[at..].to_vec();
            c.push(v.to_string());
            return Some(c);
        }
        if done.contains(v) {
            return None;
        }
        path.push(v.to_string());
        for w in &g[v] {
            if let Some(c) = visit(g, w, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(v.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for v in g.keys() {
        if let Some(c) = visit(g, v, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

fn graph(sources: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let root: BTreeMap<&str, &str> = ROOT_ITEMS.into_iter().collect();
    sources
        .iter()
        .map(|(m, text)| {
            let deps = imports(&code_of(text))
                .into_iter()
                .filter_map(|d| {
                    if sources.contains_key(&d) {
                        Some(d)
                    } else {
                        root.get(d.as_str()).map(|m| m.to_string())
                    }
                })
                .filter(|d| d != m)
                .collect();
            (m.clone(), deps)
        })
        .collect()
}

#[test]
fn no_module_imports_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = BTreeMap::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.extension().is_some_and(|x| x == "rs") && name != "lib" && name != "main" {
            sources.insert(name, std::fs::read_to_string(&p).unwrap());
        } else if p.is_dir() && p.join("mod.rs").exists() {
            // A module of several files: one module here (its tests
            // file is its test module).
            let mut text = String::new();
            for f in std::fs::read_dir(&p).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|x| x == "rs")
                    && f.file_stem().is_some_and(|s| s != "tests")
                {
                    text.push_str(&std::fs::read_to_string(&f).unwrap());
                    text.push('\n');
                }
            }
            sources.insert(name, text);
        }
    }
    assert!(sources.len() > 20, "{} modules read", sources.len());
    let g = graph(&sources);
    if let Some(c) = circle(&g) {
        panic!("modules import each other in a circle: {}", c.join(" -> "));
    }
    // Control: one import back up (the model importing the balancer) is
    // a circle the check finds.
    let mut bad = sources.clone();
    let state = bad.get_mut("state").unwrap();
    state.insert_str(0, "fn f(_: &crate::Balancer) {}\n");
    assert!(
        circle(&graph(&bad)).is_some(),
        "a planted circle was missed"
    );
}
