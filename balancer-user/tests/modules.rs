//! The house rules of the workspace's module graphs, read from the source:
//!
//! 1. in every crate (balancer-common; the eBPF crate's three programs;
//!    this crate's library; the test bed's library), modules import each
//!    other without a circle, so each can be read, and tested, with only
//!    the ones below it;
//! 2. this crate's library is in rooms (the folders under `src/`), in the
//!    order of [`ROOMS`], lowest first, and a module imports only from its
//!    own room or a lower one: the model at the bottom, the daemon at the
//!    top (docs/layout.md);
//! 3. no function of the product crates (balancer-common, the eBPF
//!    crate's programs, this crate's library and binary) is over
//!    [`MAX_FN_LINES`] lines, from its `fn` line to its closing brace
//!    (test items left out), but the data tables of [`DATA_TABLES`];
//! 4. the facade, `Balancer`, has fewer than [`MAX_BALANCER_FIELDS`]
//!    fields: each concern is a part of its own (issue 42).
//!
//! An import is any path in the code that names a module of the crate:
//! `crate::a::b` paths, `super::` and `self::` paths, paths that start with
//! a child module's name, each leaf of a `use` tree, and a string that is
//! a path (serde's `with = "crate::..."`). The crate root's re-exports
//! count as imports of the module they re-export (`crate::Balancer` is
//! `balancer`'s). Comments and `#[cfg(test)]` items are left out: tests
//! may reach anywhere.
//!
//! A node of the graph is a module, one file, except that a module whose
//! file holds code is one node with its submodules (the files of one
//! module: `balancer/mod.rs` with `changes.rs` and `specialise.rs`; the
//! test bed's `fixtures.rs` with `fixtures/`), while a module whose file
//! only declares others (a room's `mod.rs`) is no node: its modules are.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// The rooms of this crate's library, lowest first, with what each holds:
/// a module may import from its own room and the rooms before it
/// (docs/layout.md).
const ROOMS: [(&str, &str); 7] = [
    (
        "model",
        "errors, prefixes, the state and its rules, commands, the configuration, \
         the API's types, retired VIPs and backends, the projection, the state file",
    ),
    (
        "datapath",
        "maps, batched reads, expiry, the flows' wire form, interfaces, links, \
         the decapsulation program",
    ),
    (
        "signals",
        "probes, health, eligibility, the agent and latency signals, locality, \
         candidate tables, regret, telemetry",
    ),
    ("balancer", "the facade"),
    (
        "serve",
        "control, HTTP, metrics, the CLI's client, rate-limited logs",
    ),
    ("cluster", "the cluster sync, BGP"),
    ("daemon", "start-up and shutdown, services, preflight"),
];

/// The longest a product function may be, lines from its `fn` line to
/// its closing brace.
const MAX_FN_LINES: usize = 150;

/// Functions that are a table of data, allowed any length: file (from the
/// workspace's root) and name.
const DATA_TABLES: &[(&str, &str)] = &[("balancer-common/src/layout.rs", "fingerprint")];

/// Long functions allowed until their split lands (`place_inner`, the
/// new-flow placement, is being split on another branch); one of these
/// found no longer too long fails too, so the allowance gets removed.
const KNOWN_LONG: &[(&str, &str)] = &[];

/// The roots of the product crates' module trees.
const PRODUCT_ROOTS: &[&str] = &[
    "balancer-common/src/lib.rs",
    "balancer-macros/src/lib.rs",
    "balancer-ebpf/src/main.rs",
    "balancer-ebpf/src/decap.rs",
    "balancer-ebpf/src/faults.rs",
    "balancer-user/src/lib.rs",
    "balancer-user/src/main.rs",
];

/// `Balancer` has fewer fields than this.
const MAX_BALANCER_FIELDS: usize = 12;

/// A module path in its crate (`["model", "state"]`; the root is `[]`).
type ModPath = Vec<String>;

/// One module file.
#[derive(Clone, Debug)]
struct File {
    /// Where it is, for messages.
    path: PathBuf,
    /// The code, comments and test items left out.
    code: String,
    /// Its child modules (declared with `mod x;`).
    children: BTreeSet<String>,
}

/// A crate's module files by module path.
type Crate = BTreeMap<ModPath, File>;

/// One import: the module that imports, the path as written, the module
/// it names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Import {
    from: ModPath,
    /// The file it is written in.
    file: PathBuf,
    written: String,
    to: ModPath,
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The code without comments, with the text of string and character
/// literals blanked except a string that is a path (serde's `with`).
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let is_path = |s: &str| {
        !s.is_empty()
            && s.contains("::")
            && s.split("::").all(|p| {
                p.chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_')
                    && p.chars().all(ident_char)
            })
    };
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    // Lines are kept, for the lengths of functions.
                    if c[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == '"'
            || (c[i] == 'r'
                && (i == 0
                    || !ident_char(c[i - 1])
                    || (c[i - 1] == 'b' && (i < 2 || !ident_char(c[i - 2]))))
                && matches!(c.get(i + 1), Some('"' | '#')))
        {
            // A string; raw (r"..", r#".."#) or not.
            let raw = c[i] == 'r';
            let mut hashes = 0;
            if raw {
                i += 1;
                while c.get(i) == Some(&'#') {
                    hashes += 1;
                    i += 1;
                }
                if c.get(i) != Some(&'"') {
                    // `r#ident`, a raw identifier.
                    out.push_str("r#");
                    continue;
                }
            }
            i += 1;
            let mut s = String::new();
            while i < c.len() {
                if !raw && c[i] == '\\' {
                    s.push(c[i]);
                    s.push(*c.get(i + 1).unwrap_or(&' '));
                    i += 2;
                    continue;
                }
                if c[i] == '"' && (0..hashes).all(|k| c.get(i + 1 + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                s.push(c[i]);
                i += 1;
            }
            out.push('"');
            // A path, or a file a `#[path]` attribute names.
            if is_path(&s) || (s.ends_with(".rs") && !s.contains(char::is_whitespace)) {
                out.push_str(&s);
            } else {
                out.extend(s.chars().map(|ch| if ch == '\n' { '\n' } else { ' ' }));
            }
            out.push('"');
        } else if c[i] == '\'' && (c.get(i + 1) == Some(&'\\') || c.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\u{..}'); not a lifetime.
            i += 1;
            while i < c.len() && c[i] != '\'' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The index just past the item that starts at `from`: its `;` or its
/// closing brace, whichever comes first.
fn item_end(code: &str, from: usize) -> usize {
    let b = code.as_bytes();
    let mut i = from;
    let mut depth = 0usize;
    while i < b.len() {
        match b[i] {
            b';' if depth == 0 => return i + 1,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// The code without `#[cfg(test)]` items (test modules, test-only
/// helpers and their imports); their lines are kept, empty.
fn without_tests(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(k) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..k]);
        let end = k + item_end(&rest[k..], "#[cfg(test)]".len());
        out.extend(rest[k..end].matches('\n').map(|_| '\n'));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The `mod x;` declarations of a file's code (not inline modules), with
/// the file a `#[path = ".."]` attribute names.
fn declared_modules(code: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut path_attr = None;
    for line in code.lines().map(str::trim) {
        if let Some(p) = line
            .strip_prefix("#[path = \"")
            .and_then(|l| l.strip_suffix("\"]"))
        {
            path_attr = Some(p.to_string());
            continue;
        }
        if line.starts_with("#[") {
            continue;
        }
        let decl = line
            .strip_prefix("pub ")
            .or_else(|| line.strip_prefix("pub(crate) "))
            .or_else(|| line.strip_prefix("pub(super) "))
            .unwrap_or(line);
        if let Some(name) = decl.strip_prefix("mod ").and_then(|l| l.strip_suffix(';')) {
            out.push((name.trim().to_string(), path_attr.take()));
        } else {
            path_attr = None;
        }
    }
    out
}

/// Reads a crate from its root file, following `mod x;` declarations
/// (those under `#[cfg(test)]` are test modules and are not followed).
fn read_crate(root: &Path) -> Crate {
    fn read(path: &Path, at: ModPath, is_dir_owner: bool, out: &mut Crate) {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let code = without_tests(&strip(&text));
        let dir = if is_dir_owner {
            path.parent().unwrap().to_path_buf()
        } else {
            path.with_extension("")
        };
        let mut children = BTreeSet::new();
        for (name, path_attr) in declared_modules(&code) {
            let (file, owner) = match path_attr {
                Some(p) => (path.parent().unwrap().join(p), false),
                None if dir.join(format!("{name}.rs")).exists() => {
                    (dir.join(format!("{name}.rs")), false)
                }
                None => (dir.join(&name).join("mod.rs"), true),
            };
            let mut child = at.clone();
            child.push(name.clone());
            read(&file, child, owner, out);
            children.insert(name);
        }
        out.insert(
            at,
            File {
                path: path.to_path_buf(),
                code,
                children,
            },
        );
    }
    let mut out = Crate::new();
    read(root, Vec::new(), true, &mut out);
    out
}

/// Every path the code writes, as its segments (a `use` tree's leaves
/// each in full; `{self}` is the path before it), with where it starts.
fn paths(code: &str) -> Vec<(usize, Vec<String>)> {
    fn ident(b: &[u8], i: usize) -> usize {
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        j
    }
    fn skip_ws(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    }
    /// A path or tree at `i` under `prefix`: its leaves and its end.
    fn tree(b: &[u8], s: &str, mut i: usize, prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
        let mut segs = prefix;
        loop {
            i = skip_ws(b, i);
            if i < b.len() && b[i] == b'{' {
                i += 1;
                let mut leaves = Vec::new();
                loop {
                    i = skip_ws(b, i);
                    if i >= b.len() {
                        return (leaves, i);
                    }
                    match b[i] {
                        b'}' => return (leaves, i + 1),
                        b',' => i += 1,
                        _ => {
                            let before = i;
                            let (l, j) = tree(b, s, i, segs.clone());
                            leaves.extend(l);
                            i = if j == before { j + 1 } else { j };
                        }
                    }
                }
            }
            if i < b.len() && b[i] == b'*' {
                segs.push("*".into());
                return (vec![segs], i + 1);
            }
            let j = ident(b, i);
            if j == i {
                return (vec![segs], i);
            }
            let name = &s[i..j];
            if name != "self" || segs.is_empty() {
                segs.push(name.to_string());
            }
            i = j;
            if b[i..].starts_with(b"::") && !b[i + 2..].starts_with(b"<") {
                i += 2;
            } else {
                return (vec![segs], i);
            }
        }
    }
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = (b[i].is_ascii_alphabetic() || b[i] == b'_')
            && (i == 0
                || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':'));
        if !starts {
            i += 1;
            continue;
        }
        let j = ident(b, i);
        if !b[j..].starts_with(b"::") {
            i = j;
            continue;
        }
        let (leaves, end) = tree(b, code, i, Vec::new());
        out.extend(leaves.into_iter().map(|l| (i, l)));
        i = end.max(j);
    }
    out
}

/// The module of the crate a path names, if it names one: the longest
/// run of its segments that are modules, from where it starts; the root's
/// re-exports followed.
/// `inline`: how many inline modules (`mod x { .. }`) of its file the
/// path is written in (their `super` is still the file's module).
fn resolve(
    c: &Crate,
    from: &ModPath,
    inline: usize,
    segs: &[String],
    depth: usize,
) -> Option<ModPath> {
    let (mut at, mut rest): (ModPath, &[String]) = match segs.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &segs[1..]),
        Some("self") => (from.clone(), &segs[1..]),
        Some("super") => {
            let mut at = from.clone();
            let mut rest = segs;
            let mut inline = inline;
            while rest.first().is_some_and(|s| s == "super") {
                if inline > 0 {
                    inline -= 1;
                } else {
                    at.pop()?;
                }
                rest = &rest[1..];
            }
            (at, rest)
        }
        Some(first) if c[from].children.contains(first) => (from.clone(), segs),
        _ => return None,
    };
    while let Some(s) = rest.first() {
        if c[&at].children.contains(s) {
            at.push(s.clone());
            rest = &rest[1..];
        } else {
            break;
        }
    }
    if at.is_empty() && depth < 4 {
        // An item of the root: one it re-exports (by name, or by a glob
        // of a module that defines it) is its module's.
        if let Some(name) = rest.first() {
            let root = &c[&Vec::new()];
            let reexports: Vec<Vec<String>> = paths(&root.code)
                .into_iter()
                .map(|(_, p)| p)
                .filter(|p| p.len() > 1)
                .collect();
            let named = reexports.iter().filter(|p| p.last() == Some(name));
            let globbed = reexports
                .iter()
                .filter(|p| p.last().is_some_and(|l| l == "*"));
            for p in named.chain(globbed) {
                if let Some(m) = resolve(c, &Vec::new(), 0, p, depth + 1) {
                    if !m.is_empty() && (p.last() == Some(name) || defines(&c[&m], name)) {
                        return Some(m);
                    }
                }
            }
        }
    }
    Some(at)
}

/// The spans of the inline modules (`mod x { .. }`) of a file's code.
fn inline_modules(code: &str) -> Vec<(usize, usize)> {
    let b = code.as_bytes();
    code.match_indices("mod ")
        .filter(|(k, _)| *k == 0 || !(b[k - 1].is_ascii_alphanumeric() || b[k - 1] == b'_'))
        .filter_map(|(k, _)| {
            let end = item_end(code, k);
            code[k..end].contains('{').then_some((k, end))
        })
        .collect()
}

/// Whether a module's code defines an item of that name.
fn defines(f: &File, name: &str) -> bool {
    let kinds = [
        "struct", "enum", "union", "trait", "type", "const", "static", "fn", "mod",
    ];
    f.code.match_indices(name).any(|(k, _)| {
        let before = f.code[..k].trim_end();
        let after = f.code[k + name.len()..].chars().next();
        !after.is_some_and(ident_char)
            && kinds.iter().any(|w| {
                before.ends_with(w)
                    && !before[..before.len() - w.len()]
                        .chars()
                        .next_back()
                        .is_some_and(ident_char)
            })
    })
}

/// Whether a module's file only declares modules and re-exports: a room.
fn declares_only(f: &File) -> bool {
    let mut code = f.code.as_str();
    let mut rest = String::new();
    while let Some(k) = code.find(|c: char| !c.is_whitespace()) {
        code = &code[k..];
        let end = if code.starts_with("#!") || code.starts_with("#[") {
            code.find(']').map_or(code.len(), |e| e + 1)
        } else {
            item_end(code, 0)
        };
        let item = &code[..end];
        let head = item
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ");
        if !(item.starts_with('#')
            || item == ";"
            || (head.starts_with("mod ") && item.ends_with(';'))
            || head.starts_with("use "))
        {
            rest.push_str(item);
        }
        code = &code[end..];
    }
    rest.trim().is_empty()
}

/// The node a module belongs to: itself, or the first module above it
/// (below the root) whose file holds code.
fn node_of(c: &Crate, m: &ModPath) -> ModPath {
    (1..m.len())
        .map(|n| m[..n].to_vec())
        .find(|p| !declares_only(&c[p]))
        .unwrap_or_else(|| m.clone())
}

/// Every import between two nodes of a crate.
fn imports(c: &Crate) -> Vec<Import> {
    let mut out = BTreeSet::new();
    for (m, f) in c {
        let inline = inline_modules(&f.code);
        for (at, p) in paths(&f.code) {
            if p.len() < 2 {
                continue;
            }
            let depth = inline
                .iter()
                .filter(|(a, b)| (*a..*b).contains(&at))
                .count();
            if let Some(to) = resolve(c, m, depth, &p, 0) {
                let (from, to) = (node_of(c, m), node_of(c, &to));
                if from != to {
                    out.insert(Import {
                        from,
                        file: f.path.clone(),
                        written: p.join("::"),
                        to,
                    });
                }
            }
        }
    }
    out.into_iter().collect()
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "(root)".into()
    } else {
        m.join("::")
    }
}

type Graph = BTreeMap<String, BTreeSet<String>>;

fn graph(imports: &[Import]) -> Graph {
    let mut g = Graph::new();
    for i in imports {
        g.entry(name(&i.to)).or_default();
        g.entry(name(&i.from)).or_default().insert(name(&i.to));
    }
    g
}

/// Every circle of the graph, each once, as its set of nodes (the
/// strongly connected components of more than one node, Tarjan).
fn circles(g: &Graph) -> Vec<BTreeSet<String>> {
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        let g: &'a Graph = t.g;
        for w in &g[v] {
            if !t.index.contains_key(w.as_str()) {
                visit(t, w);
                let lw = t.low[w.as_str()];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w.as_str()) {
                let iw = t.index[w.as_str()];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// A circle as a message: the imports that make it, each as written.
fn describe(c: &BTreeSet<String>, imports: &[Import]) -> String {
    imports
        .iter()
        .filter(|i| c.contains(&name(&i.from)) && c.contains(&name(&i.to)))
        .map(|i| format!("{} -> {} ({})", name(&i.from), name(&i.to), i.written))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The circles of a crate's graph that are not allowed: each as a message.
fn unexpected_circles(imports: &[Import], allowed: &[&[&str]]) -> Vec<String> {
    circles(&graph(imports))
        .into_iter()
        .filter(|c| {
            !allowed
                .iter()
                .any(|a| a.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>() == *c)
        })
        .map(|c| describe(&c, imports))
        .collect()
}

/// Imports from a room to a higher one, each as a message naming the
/// file and the path as written; and modules in no declared room.
fn upward(c: &Crate, imports: &[Import], rooms: &[&str]) -> Vec<String> {
    let rank = |m: &ModPath| -> Option<usize> {
        match m.first() {
            None => Some(rooms.len()),
            Some(r) => rooms.iter().position(|x| x == r),
        }
    };
    let mut out: Vec<String> = c
        .keys()
        .filter(|m| m.len() == 1 && rank(m).is_none())
        .map(|m| format!("module `{}` is in no room of the table", name(m)))
        .collect();
    for i in imports {
        let (Some(from), Some(to)) = (rank(&i.from), rank(&i.to)) else {
            continue;
        };
        if to > from {
            out.push(format!(
                "{}: `{}` imports from room `{}`, above its room `{}`",
                shown(&i.file),
                i.written,
                rooms.get(to).unwrap_or(&"(root)"),
                rooms[from]
            ));
        }
    }
    out
}

/// A file's path from the workspace's root where it is under it.
fn shown(p: &Path) -> String {
    p.strip_prefix(workspace())
        .unwrap_or(p)
        .display()
        .to_string()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn check_no_circles(root: &str, allowed: &[&[&str]]) -> Vec<Import> {
    let c = read_crate(&workspace().join(root));
    let imports = imports(&c);
    let bad = unexpected_circles(&imports, allowed);
    assert!(
        bad.is_empty(),
        "{root}: modules import each other in a circle: {}",
        bad.join("\n")
    );
    for a in allowed {
        let a: BTreeSet<String> = a.iter().map(|s| s.to_string()).collect();
        assert!(
            circles(&graph(&imports)).contains(&a),
            "{root}: the known circle {a:?} is gone: remove it from the allowance"
        );
    }
    imports
}

#[test]
fn the_library_is_in_rooms_in_order() {
    let c = read_crate(&workspace().join("balancer-user/src/lib.rs"));
    assert!(c.len() > 30, "{} modules read", c.len());
    let imports = imports(&c);
    assert!(imports.len() > 100, "{} imports read", imports.len());
    let rooms = ROOMS.map(|(r, _)| r);
    let bad = upward(&c, &imports, &rooms);
    assert!(
        bad.is_empty(),
        "imports against the rooms' order:\n{}",
        bad.join("\n")
    );
    // A room's mod.rs holds only its modules' declarations (the facade,
    // `balancer`, is a module of its own).
    for r in rooms.iter().filter(|r| **r != "balancer") {
        let f = &c[&vec![r.to_string()]];
        assert!(
            declares_only(f),
            "{} holds more than declarations",
            shown(&f.path)
        );
    }
}

#[test]
fn no_module_imports_in_a_circle() {
    let user = check_no_circles("balancer-user/src/lib.rs", &[]);
    assert!(user.len() > 100, "{} imports read", user.len());
    let common = check_no_circles("balancer-common/src/lib.rs", &[]);
    assert!(common.len() > 20, "{} imports read", common.len());
    let xdp = check_no_circles("balancer-ebpf/src/main.rs", &[]);
    assert!(xdp.len() > 30, "{} imports read", xdp.len());
    check_no_circles("balancer-ebpf/src/decap.rs", &[]);
    check_no_circles("balancer-ebpf/src/faults.rs", &[]);
    check_no_circles("balancer-macros/src/lib.rs", &[]);
    let bed = check_no_circles("tests/src/lib.rs", &[]);
    assert!(bed.len() > 30, "{} imports read", bed.len());
}

/// A crate of synthetic files under a temporary directory.
fn synthetic(files: &[(&str, &str)]) -> (tempfile::TempDir, Crate) {
    let dir = tempfile::tempdir().unwrap();
    for (p, text) in files {
        let p = dir.path().join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let c = read_crate(&dir.path().join("lib.rs"));
    (dir, c)
}

#[test]
fn the_checks_catch_a_circle_and_an_upward_import() {
    let lib = "pub mod low;\npub mod high;\npub use high::top::Top;\n";
    let low = "//! A room.\npub mod a;\npub mod b;\n";
    let high = "pub mod top;\n";
    let good = [
        ("lib.rs", lib),
        ("low/mod.rs", low),
        ("low/a.rs", "use crate::low::b::B;\npub struct A(B);\n"),
        ("low/b.rs", "pub struct B;\n// crate::low::a::A in a comment\n"),
        ("high/mod.rs", high),
        (
            "high/top.rs",
            "use crate::low::{a::A, b};\npub struct Top(A, b::B);\n#[cfg(test)]\nmod tests {\n    use crate::Top;\n}\n",
        ),
    ];
    let rooms = ["low", "high"];
    let (_d, c) = synthetic(&good);
    let i = imports(&c);
    let edges: BTreeSet<(String, String)> =
        i.iter().map(|i| (name(&i.from), name(&i.to))).collect();
    assert_eq!(
        edges,
        [
            ("(root)", "high::top"),
            ("high::top", "low::a"),
            ("high::top", "low::b"),
            ("low::a", "low::b"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .into(),
    );
    assert!(unexpected_circles(&i, &[]).is_empty());
    assert!(upward(&c, &i, &rooms).is_empty());

    // A circle: b imports a (through the root's re-export of a's user).
    let mut bad = good;
    bad[3].1 = "pub struct B;\nfn f(_: crate::Top) {}\n";
    let (_d, c) = synthetic(&bad);
    let i = imports(&c);
    let found = unexpected_circles(&i, &[]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("low::b -> high::top (crate::Top)"),
        "{}",
        found[0]
    );
    // ... and the import back up is named with its file.
    let up = upward(&c, &i, &rooms);
    assert_eq!(up.len(), 1, "{up:?}");
    assert!(
        up[0].contains("low/b.rs: `crate::Top` imports from room `high`"),
        "{}",
        up[0]
    );
    // An allowed circle passes; only exactly that one.
    assert!(unexpected_circles(&i, &[&["high::top", "low::a", "low::b"]]).is_empty());
    assert_eq!(unexpected_circles(&i, &[&["high::top", "low::b"]]).len(), 1);

    // An upward import without a circle, in a use tree.
    let mut bad = good;
    bad[2].1 = "use crate::{high::top, low::b::B};\npub struct A(B);\nfn f() { let _ = top::x; }\n";
    bad[5].1 = "use crate::low::b;\npub struct Top(b::B);\n";
    let (_d, c) = synthetic(&bad);
    let i = imports(&c);
    assert!(unexpected_circles(&i, &[]).is_empty());
    let up = upward(&c, &i, &rooms);
    assert_eq!(up.len(), 1, "{up:?}");
    assert!(up[0].contains("low/a.rs: `crate::high::top` imports from room `high`"));

    // A module in no room of the table.
    let (_d, c) = synthetic(&good);
    let up = upward(&c, &imports(&c), &["low"]);
    assert_eq!(up, ["module `high` is in no room of the table"]);
}

#[test]
fn paths_are_read_from_trees_strings_and_relative_forms() {
    let code = strip(
        "use crate::{a::{self, B}, c::*};\n\
         #[serde(with = \"crate::d::e\")]\n\
         let s = \"crate::f::g is only text\"; let ch = '{';\n\
         super::h::i(); x::<u8>::y; /* crate::j::k */ e::f();\n",
    );
    let p: Vec<String> = paths(&code)
        .into_iter()
        .map(|(_, p)| p.join("::"))
        .collect();
    assert_eq!(
        p,
        [
            "crate::a",
            "crate::a::B",
            "crate::c::*",
            "crate::d::e",
            "super::h::i",
            "x",
            "e::f"
        ]
    );
}

/// One function: where, its name, its length in lines.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Function {
    file: String,
    line: usize,
    name: String,
    lines: usize,
}

/// Every function of a file's code (comments and test items stripped,
/// lines kept) with a body: from the line of its `fn` to the line of its
/// closing brace, both counted. Nested functions count on their own and
/// in the function around them.
fn functions(file: &str, code: &str) -> Vec<Function> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for (k, _) in code.match_indices("fn") {
        let keyword = (k == 0 || !(b[k - 1].is_ascii_alphanumeric() || b[k - 1] == b'_'))
            && b.get(k + 2).is_some_and(u8::is_ascii_whitespace);
        if !keyword {
            continue;
        }
        let start = code[k + 2..]
            .find(|c: char| !c.is_whitespace())
            .map_or(code.len(), |n| k + 2 + n);
        let len = code[start..]
            .find(|c: char| !ident_char(c))
            .unwrap_or(code.len() - start);
        if len == 0 {
            continue;
        }
        let name = &code[start..start + len];
        // The body: the first brace outside the signature's parentheses
        // and brackets; a `;` first is a declaration without one.
        let mut depth = 0i32;
        let mut body = None;
        for (i, c) in code[start + len..].char_indices() {
            match c {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth <= 0 => break,
                '{' if depth <= 0 => {
                    body = Some(start + len + i);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = body else { continue };
        let end = item_end(code, open);
        let line = code[..k].matches('\n').count() + 1;
        let last = code[..end].matches('\n').count() + 1;
        out.push(Function {
            file: file.to_string(),
            line,
            name: name.to_string(),
            lines: last - line + 1,
        });
    }
    out
}

/// Every function of the crates read from `roots` (under `base`) over
/// [`MAX_FN_LINES`] that `allowed` does not name (by file and name), as
/// messages naming the file, the line, the function and its length.
fn too_long(base: &Path, roots: &[&str], allowed: &[(&str, &str)]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for root in roots {
        for f in read_crate(&base.join(root)).into_values() {
            let file = f
                .path
                .strip_prefix(base)
                .unwrap_or(&f.path)
                .display()
                .to_string();
            if !seen.insert(file.clone()) {
                continue;
            }
            for func in functions(&file, &f.code) {
                let allow = allowed
                    .iter()
                    .any(|(p, n)| *p == func.file && *n == func.name);
                if func.lines > MAX_FN_LINES && !allow {
                    out.push(format!(
                        "{}:{}: fn {} is {} lines (at most {MAX_FN_LINES})",
                        func.file, func.line, func.name, func.lines
                    ));
                }
            }
        }
    }
    out
}

/// The functions of the crates read from `roots` that `names` names (by
/// file and name) and that are no longer over [`MAX_FN_LINES`] lines.
fn no_longer_long(base: &Path, roots: &[&str], names: &[(&str, &str)]) -> Vec<String> {
    let mut long = BTreeSet::new();
    for root in roots {
        for f in read_crate(&base.join(root)).into_values() {
            let file = f
                .path
                .strip_prefix(base)
                .unwrap_or(&f.path)
                .display()
                .to_string();
            for func in functions(&file, &f.code) {
                if func.lines > MAX_FN_LINES {
                    long.insert((func.file, func.name));
                }
            }
        }
    }
    names
        .iter()
        .filter(|(p, n)| !long.contains(&(p.to_string(), n.to_string())))
        .map(|(p, n)| format!("{p}: fn {n}"))
        .collect()
}

#[test]
fn no_product_function_is_too_long() {
    let mut allowed = DATA_TABLES.to_vec();
    allowed.extend_from_slice(KNOWN_LONG);
    let long = too_long(&workspace(), PRODUCT_ROOTS, &allowed);
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them into named steps; a table \
         of data goes into DATA_TABLES):\n{}",
        long.join("\n")
    );
    let gone = no_longer_long(&workspace(), PRODUCT_ROOTS, &allowed);
    assert!(
        gone.is_empty(),
        "allowed as long but no longer over {MAX_FN_LINES} lines (remove the allowance):\n{}",
        gone.join("\n")
    );
}

/// The test bed's crate roots (its library and its binary).
const TEST_BED_ROOTS: &[&str] = &["tests/src/lib.rs", "tests/src/bin/balancer-testbed.rs"];

/// Test-bed functions that were long step functions and are now rows of a
/// table or named steps (issue 42, tests as tables): they must stay at
/// most [`MAX_FN_LINES`] lines. The test bed's other long functions are
/// reported, not failed.
const TEST_BED_SPLIT: &[(&str, &str)] = &[
    ("tests/src/fixtures/main_vip.rs", "run"),
    ("tests/src/fixtures/icmp.rs", "run"),
    ("tests/src/fixtures/udp.rs", "run"),
    ("tests/src/operator.rs", "api"),
    ("tests/src/cluster.rs", "run_on"),
    ("tests/src/hostile/mod.rs", "run_on"),
];

#[test]
fn test_bed_functions_report() {
    // Every test-bed function over the limit, printed (`--nocapture`);
    // only the ones split into tables or steps fail the test.
    let long = too_long(&workspace(), TEST_BED_ROOTS, &[]);
    println!(
        "test-bed functions over {MAX_FN_LINES} lines (not failed; issue 42 splits them as \
         it goes): {}\n{}",
        long.len(),
        long.join("\n")
    );
    let back: Vec<&String> = long
        .iter()
        .filter(|l| {
            TEST_BED_SPLIT.iter().any(|(p, n)| {
                l.starts_with(&format!("{p}:")) && l.contains(&format!(": fn {n} is "))
            })
        })
        .collect();
    assert!(
        back.is_empty(),
        "test-bed functions split into tables or named steps are long again:\n{back:?}"
    );
    // The names still exist: a renamed function leaves the list, not
    // silently the check.
    let all: BTreeSet<(String, String)> = TEST_BED_ROOTS
        .iter()
        .flat_map(|root| read_crate(&workspace().join(root)).into_values())
        .flat_map(|f| {
            let file = shown(&f.path);
            functions(&file, &f.code)
                .into_iter()
                .map(|func| (func.file, func.name))
                .collect::<Vec<_>>()
        })
        .collect();
    let gone: Vec<_> = TEST_BED_SPLIT
        .iter()
        .filter(|(p, n)| !all.contains(&(p.to_string(), n.to_string())))
        .collect();
    assert!(gone.is_empty(), "no such test-bed functions: {gone:?}");
}

#[test]
fn the_length_check_catches_a_long_function() {
    // A function of 150 lines passes, one of 151 fails, named with its
    // file, line and length; a table named in the allowance passes, the
    // same under another name does not.
    let body = |n: usize| "    let _ = 1;\n".repeat(n - 2);
    let lib = format!(
        "pub mod a;\n\
         /* a comment\n over lines */ pub fn fine() {{\n{}}}\n\
         #[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}    }}\n}}\n",
        body(150),
        body(400)
    );
    let a = format!(
        "pub struct S;\nimpl S {{\n    pub fn decl(&self);\n    pub fn long(&self, x: [u8; 2]) -> u8 \
         {{\n{}    \"}}\"; 0 }}\n}}\nfn table() {{\n{}}}\n",
        body(151),
        body(300)
    );
    let (dir, c) = synthetic(&[("lib.rs", &lib), ("a.rs", &a)]);
    let base = dir.path();
    let found = too_long(base, &["lib.rs"], &[("a.rs", "table")]);
    assert_eq!(found, ["a.rs:4: fn long is 151 lines (at most 150)"]);
    // Lines of comments count; a test module's functions do not.
    let in_lib = functions("lib.rs", &c[&Vec::new()].code);
    assert_eq!(
        in_lib
            .iter()
            .map(|f| (f.line, f.name.as_str(), f.lines))
            .collect::<Vec<_>>(),
        [(3, "fine", 150)]
    );
    let found = too_long(base, &["lib.rs"], &[("lib.rs", "table")]);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[1].contains("fn table is 300 lines"), "{found:?}");
    assert_eq!(
        no_longer_long(base, &["lib.rs"], &[("a.rs", "table"), ("lib.rs", "fine")]),
        ["lib.rs: fn fine"]
    );
}

/// The fields of the struct `name` defined in `code` (braced; `None`
/// when it is not defined there).
fn struct_fields(code: &str, name: &str) -> Option<Vec<String>> {
    let b = code.as_bytes();
    let k = code.match_indices("struct").find_map(|(k, _)| {
        let keyword = (k == 0 || !(b[k - 1].is_ascii_alphanumeric() || b[k - 1] == b'_'))
            && b.get(k + 6).is_some_and(u8::is_ascii_whitespace);
        let rest = code[k + 6..].trim_start();
        let named =
            rest.starts_with(name) && !rest[name.len()..].starts_with(|c: char| ident_char(c));
        (keyword && named).then_some(k)
    })?;
    let open = k + code[k..].find(['{', ';', '('])?;
    if b[open] != b'{' {
        return Some(Vec::new());
    }
    let end = item_end(code, open);
    let body = &code[open + 1..end - 1];
    // Split at the commas outside brackets of any kind; attributes go.
    let mut fields = Vec::new();
    let mut depth = 0i32;
    let mut field = String::new();
    for c in body.chars() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            '>' if !field.ends_with('-') => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            fields.push(std::mem::take(&mut field));
        } else {
            field.push(c);
        }
    }
    fields.push(field);
    Some(
        fields
            .into_iter()
            .map(|f| {
                let mut f = f.trim().to_string();
                while f.starts_with("#[") {
                    let e = f.find(']').map_or(f.len(), |e| e + 1);
                    f = f[e..].trim().to_string();
                }
                f
            })
            .filter(|f| !f.is_empty())
            .map(|f| f.split(':').next().unwrap_or_default().trim().to_string())
            .collect(),
    )
}

/// The fields of `Balancer` in this crate's library.
fn balancer_fields(base: &Path) -> Vec<String> {
    read_crate(&base.join("balancer-user/src/lib.rs"))
        .values()
        .find_map(|f| struct_fields(&f.code, "Balancer"))
        .expect("pub struct Balancer is defined in the library")
}

#[test]
fn the_balancer_has_few_fields() {
    let fields = balancer_fields(&workspace());
    assert!(fields.len() > 2, "{fields:?} read");
    assert!(
        fields.len() < MAX_BALANCER_FIELDS,
        "Balancer has {} fields (fewer than {MAX_BALANCER_FIELDS}: give a concern a part of its \
         own): {}",
        fields.len(),
        fields.join(", ")
    );
}

#[test]
fn the_field_check_catches_a_wide_balancer() {
    // Eleven fields pass, twelve do not; attributes and types with
    // commas and arrows are read as one field each.
    let fields = |n: usize| -> String {
        (0..n)
            .map(|i| {
                format!("    #[allow(dead_code)]\n    f{i}: BTreeMap<u8, fn(u8) -> (u8, u8)>,\n")
            })
            .collect()
    };
    for (n, ok) in [(11, true), (12, false)] {
        let lib = format!(
            "pub struct Other {{ a: u8 }}\npub struct Balancer {{\n{}}}\n",
            fields(n)
        );
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("balancer-user/src");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("lib.rs"), lib).unwrap();
        let f = balancer_fields(dir.path());
        assert_eq!(f.len(), n, "{f:?}");
        assert_eq!(f[n - 1], format!("f{}", n - 1));
        assert_eq!(f.len() < MAX_BALANCER_FIELDS, ok);
    }
}
