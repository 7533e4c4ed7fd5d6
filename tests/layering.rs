//! The house of docs/architecture.md, checked: which module imports which, read from the
//! `crate::` and `super::` paths of `src/` (tests left out), with no import cycle among
//! files or among rooms, and nothing importing the composition root. A parent module's
//! use of the children it declares (`http/mod.rs` merging `payments::router()`) is their
//! composition, not counted.
//!
//! `cargo test --test layering -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file under `src/`, as its module path (`saga::store`, `http`, `main`).
fn modules() -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src/ readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files
        .into_iter()
        .map(|path| {
            let relative = path
                .strip_prefix(&src)
                .expect("under src/")
                .with_extension("");
            let mut parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.len() > 1 && parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            (parts.join("::"), path)
        })
        .collect()
}

/// The source without its `#[cfg(test)] mod tests` and without comments.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("readable");
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paths after `prefix` (`crate::`, `super::`), with `{a, b::{c, d}}` groups expanded.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    fn expand(base: &[String], text: &str, out: &mut Vec<Vec<String>>) {
        let mut depth = 0;
        let mut start = 0;
        let mut items = Vec::new();
        for (i, ch) in text.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&text[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(&text[start..]);
        for item in items {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            if let Some(open) = item.find('{') {
                let mut next = base.to_vec();
                next.extend(segments(&item[..open]));
                let close = item.rfind('}').unwrap_or(item.len());
                expand(&next, &item[open + 1..close], out);
            } else {
                let mut path = base.to_vec();
                path.extend(segments(item.split_whitespace().next().unwrap_or("")));
                out.push(path);
            }
        }
    }
    fn segments(text: &str) -> Vec<String> {
        text.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if rest.starts_with('{') {
            let mut depth = 0;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(rest.len(), |(i, _)| i);
            expand(&[], &rest[1..end], &mut out);
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            out.push(segments(&rest[..end]));
        }
    }
    out
}

/// The longest module path that `path` starts with.
fn resolve(path: &[String], modules: &BTreeMap<String, PathBuf>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|candidate| modules.contains_key(candidate))
}

/// One node per file.
fn file_graph() -> Graph {
    let modules = modules();
    let mut graph = Graph::new();
    for (name, path) in &modules {
        let code = code(path);
        let here: Vec<String> = if name == "lib" || name == "main" {
            Vec::new()
        } else {
            name.split("::").map(str::to_owned).collect()
        };
        // `super` of `a/b.rs` (and of `a/b/mod.rs`) is `a`; inside a module written inline
        // in the file (`mod sql { … }`), it is the file's own module.
        let parent: Vec<String> = here[..here.len().saturating_sub(1)].to_vec();
        let inline = code
            .match_indices("mod ")
            .find(|(at, _)| {
                let line_start = code[..*at].rfind('\n').map_or(0, |n| n + 1);
                let head = code[line_start..*at].trim();
                let rest = &code[*at..];
                let line = &rest[..rest.find('\n').unwrap_or(rest.len())];
                (head.is_empty() || head.starts_with("pub")) && line.trim_end().ends_with('{')
            })
            .map_or(code.len(), |(at, _)| at);
        let mut targets = BTreeSet::new();
        for p in paths_after(&code, "crate::") {
            targets.extend(resolve(&p, &modules));
        }
        for (part, base) in [(&code[..inline], &parent), (&code[inline..], &here)] {
            for p in paths_after(part, "super::") {
                let mut full = base.clone();
                full.extend(p);
                targets.extend(resolve(&full, &modules));
            }
        }
        if name == "main" {
            for p in paths_after(&code, "pagos::") {
                targets.extend(resolve(&p, &modules));
            }
        }
        targets.remove(name);
        targets.remove("lib");
        graph.insert(name.clone(), targets);
    }
    graph
}

/// The commands that live in a folder they do not belong to: programs of their own.
const COMMANDS: [&str; 3] = [
    "merchants::cli",
    "gateway::sandbox_server",
    "operators::cli",
];

fn room(module: &str) -> String {
    if COMMANDS.contains(&module) {
        module.to_owned()
    } else {
        module.split("::").next().unwrap_or(module).to_owned()
    }
}

/// One node per room: a top-level module (file or folder), the two commands apart.
fn room_graph(files: &Graph) -> Graph {
    let mut graph = Graph::new();
    for (module, targets) in files {
        let from = room(module);
        let entry = graph.entry(from.clone()).or_default();
        entry.extend(targets.iter().map(|t| room(t)).filter(|t| *t != from));
    }
    graph
}

/// The strongly connected groups of more than one node (Tarjan).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Search<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !search.index.contains_key(v.as_str()) {
            search.visit(v);
        }
    }
    search.found
}

/// The graph, for `--nocapture` (a test's own output: captured unless asked for).
#[allow(clippy::print_stdout)]
fn show(title: &str, graph: &Graph) {
    println!("## {title}");
    for (from, to) in graph {
        if !to.is_empty() {
            let to: Vec<&str> = to.iter().map(String::as_str).collect();
            println!("{from:<24} -> {}", to.join(", "));
        }
    }
}

#[test]
fn no_file_imports_another_that_imports_it_back_however_far_round() {
    let files = file_graph();
    show("files", &files);
    assert_eq!(cycles(&files), Vec::<Vec<String>>::new());
}

#[test]
fn no_room_imports_another_that_imports_it_back_however_far_round() {
    let rooms = room_graph(&file_graph());
    show("rooms", &rooms);
    assert_eq!(cycles(&rooms), Vec::<Vec<String>>::new());
}

/// The layers of docs/architecture.md, top to bottom, by room.
const LAYERS: [(&str, &[&str]); 7] = [
    ("composition root", &["main", "app"]),
    (
        "other commands",
        &[
            "merchants::cli",
            "gateway::sandbox_server",
            "operators::cli",
        ],
    ),
    (
        "doors and workers",
        &["http", "reconciler", "reaper", "dispatcher"],
    ),
    ("settings", &["config", "telemetry", "signals"]),
    (
        "saga layer",
        &["saga", "webhooks", "metrics", "representation"],
    ),
    (
        "storage and adapters",
        &[
            "merchants",
            "gateway",
            "delivery",
            "db",
            "failpoint",
            "operators",
            "outbox",
        ],
    ),
    (
        "pure domain and entities",
        &["idempotency", "domain", "entities"],
    ),
];

#[test]
fn every_import_goes_down_the_layers_or_sideways() {
    let layer_of = |room: &str| {
        LAYERS
            .iter()
            .position(|(_, rooms)| rooms.contains(&room))
            .unwrap_or_else(|| panic!("room {room} is in no layer of docs/architecture.md"))
    };
    for (from, targets) in room_graph(&file_graph()) {
        for to in targets {
            assert!(
                layer_of(&to) >= layer_of(&from),
                "{from} ({}) imports {to} ({}), a layer above it",
                LAYERS[layer_of(&from)].0,
                LAYERS[layer_of(&to)].0,
            );
        }
    }
}

#[test]
fn nothing_but_main_imports_the_composition_root() {
    for (module, targets) in file_graph() {
        if module != "main" {
            assert!(!targets.contains("app"), "{module} imports app");
        }
    }
}

#[test]
fn http_and_the_workers_never_import_each_other() {
    let rooms = room_graph(&file_graph());
    let side_by_side = ["http", "reconciler", "reaper", "dispatcher"];
    for from in side_by_side {
        for to in side_by_side {
            if from != to {
                assert!(
                    !rooms.get(from).is_some_and(|t| t.contains(to)),
                    "{from} imports {to}"
                );
            }
        }
    }
}

#[test]
fn the_store_never_renders_an_answer() {
    let files = file_graph();
    let store = &files["saga::store"];
    for rendering in ["representation", "http", "http::problem"] {
        assert!(
            !store.contains(rendering),
            "saga::store imports {rendering}"
        );
    }
}

#[test]
fn the_method_sees_a_cycle_when_there_is_one() {
    let mut graph = Graph::new();
    graph.insert("a".into(), ["b".to_owned()].into());
    graph.insert("b".into(), ["c".to_owned()].into());
    graph.insert("c".into(), ["a".to_owned()].into());
    graph.insert("d".into(), ["a".to_owned()].into());
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "c"]]);
    let paths = paths_after(
        "use crate::{saga::{self, store::Written}, http};\nlet x = crate::db::now();",
        "crate::",
    );
    let joined: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        joined,
        ["saga::self", "saga::store::Written", "http", "db::now"]
    );
}
