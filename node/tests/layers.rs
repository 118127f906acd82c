//! The node's modules depend on each other one way only: api → apply →
//! raft → state, with leases, metrics and auth beside (see the graph this
//! prints with `cargo test -p raftlock-node --test layers -- --nocapture`).
//!
//! An edge is a `crate::MODULE` path in a module's source outside its
//! tests and comments; a module is a top-level file or folder of
//! `node/src`. A cycle of any length (a → b → c → a) fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The modules `source` (a file of module `module`) names through `crate::`.
fn imports(module: &str, source: &str) -> BTreeSet<String> {
    // Tests sit at the end of a file, in `#[cfg(test)] mod tests`.
    let code = match source.find("#[cfg(test)]\nmod ") {
        Some(i) => &source[..i],
        None => source,
    };
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                // `use crate::{a::X, b}`: every path's first segment.
                Some(group) => group
                    .split(',')
                    .map(|p| p.trim().split("::").next().unwrap_or(""))
                    .collect(),
                None => vec![rest.split("::").next().unwrap_or("")],
            };
            for name in names {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                // Lower case: a module (upper case is a root constant).
                if name.starts_with(|c: char| c.is_ascii_lowercase()) && name != module {
                    out.insert(name);
                }
            }
        }
    }
    out
}

fn walk(dir: &Path, module: Option<&str>, graph: &mut Graph) {
    for entry in std::fs::read_dir(dir).expect("read node/src") {
        let path = entry.expect("dir entry").path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let top = module
            .map(str::to_string)
            .unwrap_or_else(|| file.trim_end_matches(".rs").to_string());
        if module.is_none() && (file == "bin" || file == "lib.rs") {
            continue;
        }
        if path.is_dir() {
            walk(&path, Some(&top), graph);
        } else if file.ends_with(".rs") && file != "tests.rs" && file != "proptests.rs" {
            let source = std::fs::read_to_string(&path).expect("read source");
            graph
                .entry(top.clone())
                .or_default()
                .extend(imports(&top, &source));
        }
    }
}

/// A cycle in `graph` (its modules in order, the first repeated at the
/// end), if there is one: a depth-first search that meets a module already
/// on its path has found one.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        OnPath,
        Done,
    }
    fn visit(
        graph: &Graph,
        module: &str,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(module) {
            Some(Mark::Done) => return None,
            Some(Mark::OnPath) => {
                let start = path.iter().position(|m| m == module).expect("on the path");
                let mut found = path[start..].to_vec();
                found.push(module.to_string());
                return Some(found);
            }
            None => {}
        }
        marks.insert(module.to_string(), Mark::OnPath);
        path.push(module.to_string());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(found) = visit(graph, next, marks, path) {
                return Some(found);
            }
        }
        path.pop();
        marks.insert(module.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|m| visit(graph, m, &mut marks, &mut Vec::new()))
}

fn node_graph() -> Graph {
    let mut graph = Graph::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        None,
        &mut graph,
    );
    graph
}

#[test]
fn modules_import_one_way_without_cycles() {
    let graph = node_graph();
    for (module, targets) in &graph {
        let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
        println!("{module:>8} -> {}", targets.join(" "));
    }
    assert!(graph.len() >= 10, "modules not found: {graph:?}");
    if let Some(found) = cycle(&graph) {
        panic!(
            "modules import each other in a cycle: {}",
            found.join(" -> ")
        );
    }
    for leaf in ["codec", "metrics", "tls"] {
        assert_eq!(graph[leaf], BTreeSet::new(), "{leaf} must import no module");
    }
    // The lock table encodes its snapshot through the one codec, and
    // nothing else of the node.
    assert_eq!(
        graph["state"],
        BTreeSet::from(["codec".to_string()]),
        "state must import no module but codec"
    );
}

#[test]
fn the_check_sees_edges_in_every_form_and_skips_tests_and_comments() {
    let source = "use crate::raft::{Batch, Raft};\n\
                  use crate::{auth::Caller, error};\n\
                  // crate::commented\n\
                  fn f() { crate::leases::go(crate::MAX) }\n\
                  #[cfg(test)]\nmod tests { use crate::node; }\n";
    let found: Vec<String> = imports("api", source).into_iter().collect();
    assert_eq!(found, ["auth", "error", "leases", "raft"]);
}

#[test]
fn the_check_finds_cycles_of_any_length() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        cycle(&graph(&[("a", "b"), ("b", "a")])),
        Some(names(&["a", "b", "a"]))
    );
    assert_eq!(
        cycle(&graph(&[
            ("raft", "auth"),
            ("auth", "error"),
            ("error", "raft")
        ])),
        Some(names(&["auth", "error", "raft", "auth"]))
    );
    // A diamond is no cycle.
    assert_eq!(
        cycle(&graph(&[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])),
        None
    );
    assert_eq!(cycle(&graph(&[("a", "a")])), Some(names(&["a", "a"])));
}
