//! The broker's module layering, checked from its source: no import circle
//! between modules (top-level modules, and every file's module among its
//! siblings and parent), and every top-level module uses only modules of its
//! own layer or below, as the layering list in `src/lib.rs`'s doc says.
//!
//! A module's dependencies are the paths its non-test code names:
//! `crate::a::b` (also inside `use crate::{..}` groups), `super::x`, and
//! `child::x` for a declared child. `mod x;` alone is no dependency. Comments,
//! strings and `#[cfg(test)] mod tests` (at the end of a file) are ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

#[test]
fn no_import_circles_and_layers_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = read_modules(&src);
    let edges = dependencies(&modules);

    let cycles = circles(&edges);
    assert!(
        cycles.is_empty(),
        "import circles between modules: {cycles:#?}"
    );
    let top = fold_to_top(&edges);
    let top_cycles = circles(&top);
    assert!(
        top_cycles.is_empty(),
        "import circles between top-level modules: {top_cycles:#?}"
    );

    let layers = layers_from_lib_doc(&src.join("lib.rs"));
    let declared: BTreeSet<String> = modules
        .keys()
        .filter(|m| m.len() == 1)
        .map(|m| m[0].clone())
        .collect();
    let listed: BTreeSet<String> = layers.keys().cloned().collect();
    assert_eq!(
        declared, listed,
        "every top-level module is in exactly one layer of lib.rs's doc"
    );
    let mut upward = Vec::new();
    for (from, tos) in &top {
        let (Some(from_name), Some(from_layer)) = (from.first(), from.first().map(|m| layers[m]))
        else {
            continue; // lib.rs itself sits above every layer
        };
        for to in tos {
            let Some(to_name) = to.first() else { continue };
            if layers[to_name] > from_layer {
                upward.push(format!("{from_name} -> {to_name}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "modules using a higher layer: {upward:?}"
    );
}

#[test]
fn files_stay_under_a_thousand_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut long = Vec::new();
    for path in rust_files(&src) {
        let lines = std::fs::read_to_string(&path).map_or(0, |text| text.lines().count());
        if lines > 1000 {
            long.push(format!("{} ({lines} lines)", path.display()));
        }
    }
    assert!(long.is_empty(), "files over 1000 lines: {long:?}");
}

/// The layers listed in lib.rs's doc: lines `//! N. name: `a`, `b``.
fn layers_from_lib_doc(lib: &Path) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(lib).unwrap_or_default();
    let mut layers = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("//! ") else {
            continue;
        };
        let Some((number, modules)) = rest.split_once(". ") else {
            continue;
        };
        let Ok(layer) = number.trim().parse::<usize>() else {
            continue;
        };
        let Some((_, modules)) = modules.split_once(':') else {
            continue;
        };
        for name in modules.split(',') {
            let name = name.trim().trim_matches('`').trim_end_matches('.');
            if !name.is_empty() {
                layers.insert(name.to_string(), layer);
            }
        }
    }
    assert!(!layers.is_empty(), "no layering list in lib.rs's doc");
    layers
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Module path → its non-test code, comments and literals blanked.
fn read_modules(src: &Path) -> BTreeMap<Module, String> {
    let mut modules = BTreeMap::new();
    for path in rust_files(src) {
        let relative = path.strip_prefix(src).unwrap_or(&path).with_extension("");
        let mut module: Module = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module.last().is_some_and(|m| m == "mod" || m == "lib") {
            module.pop();
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        modules.insert(module, without_tests(&blank(&text)));
    }
    modules
}

/// Blanks comments, string literals and char literals.
fn blank(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let at = |i: usize, s: &str| {
        s.chars()
            .enumerate()
            .all(|(k, c)| chars.get(i + k) == Some(&c))
    };
    while i < chars.len() {
        let c = chars[i];
        if at(i, "//") {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            i += 2;
            while i < chars.len() && !at(i, "*/") {
                i += 1;
            }
            i += 2;
        } else if c == 'r'
            && (at(i, "r\"") || at(i, "r#"))
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'))
        {
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let end: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            i += 2 + hashes;
            while i < chars.len() && !at(i, &end) {
                i += 1;
            }
            i += end.chars().count();
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && (chars.get(i + 1) == Some(&'\\') || chars.get(i + 2) == Some(&'\''))
        {
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The code before `#[cfg(test)] mod` (tests sit at the end of a file).
fn without_tests(code: &str) -> String {
    let mut search = 0;
    while let Some(found) = code[search..].find("#[cfg(test)]") {
        let start = search + found;
        let after = code[start + "#[cfg(test)]".len()..].trim_start();
        let mut rest = after;
        while rest.starts_with("#[") {
            rest = rest
                .find(']')
                .map_or("", |end| rest[end + 1..].trim_start());
        }
        if rest.starts_with("mod ") {
            return code[..start].to_string();
        }
        search = start + 1;
    }
    code.to_string()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Paths named in `code`: `(base, segments)` with base `crate`, `super` or
/// an identifier followed by `::`.
fn paths(code: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        if !is_ident(bytes[i]) || (i > 0 && (is_ident(bytes[i - 1]) || bytes[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_ident(bytes[i]) {
            i += 1;
        }
        let first: String = bytes[start..i].iter().collect();
        let mut segments = Vec::new();
        let mut j = i;
        loop {
            if bytes.get(j) != Some(&':') || bytes.get(j + 1) != Some(&':') {
                break;
            }
            j += 2;
            while bytes.get(j).is_some_and(|c| c.is_whitespace()) {
                j += 1;
            }
            if bytes.get(j) == Some(&'{') {
                // A group: every item is a path below what came so far.
                let mut depth = 0;
                let mut k = j;
                while k < bytes.len() {
                    match bytes[k] {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    k += 1;
                }
                let inner: String = bytes[j + 1..k.min(bytes.len())].iter().collect();
                for item in expand_group(&inner) {
                    let mut full = segments.clone();
                    full.extend(item);
                    found.push((first.clone(), full));
                }
                j = k + 1;
                segments.clear();
                break;
            }
            let segment_start = j;
            while j < bytes.len() && is_ident(bytes[j]) {
                j += 1;
            }
            if j == segment_start {
                break;
            }
            segments.push(bytes[segment_start..j].iter().collect());
        }
        if !segments.is_empty() {
            found.push((first, segments));
        }
        i = j.max(i);
    }
    found
}

/// The paths of a `use` group's items (`a::b, c::{d, self}, e as f`).
fn expand_group(inner: &str) -> Vec<Vec<String>> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (index, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    let mut paths = Vec::new();
    for item in items {
        let item = item.trim();
        let item = item.split(" as ").next().unwrap_or(item).trim();
        if item.is_empty() || item == "*" {
            continue;
        }
        match item.split_once("::{") {
            Some((prefix, rest)) => {
                let prefix: Vec<String> =
                    prefix.split("::").map(|s| s.trim().to_string()).collect();
                let rest = rest.trim_end().strip_suffix('}').unwrap_or(rest);
                for tail in expand_group(rest) {
                    let mut full = prefix.clone();
                    full.extend(tail);
                    paths.push(full);
                }
            }
            None => paths.push(
                item.split("::")
                    .map(|s| s.trim().to_string())
                    .filter(|s| s != "self" && s != "*")
                    .collect(),
            ),
        }
    }
    paths
}

/// Module → the modules it names (not itself).
fn dependencies(modules: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let resolve = |segments: &[String]| -> Module {
        (0..=segments.len())
            .rev()
            .map(|n| segments[..n].to_vec())
            .find(|m| modules.contains_key(m))
            .unwrap_or_default()
    };
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, code) in modules {
        let children: BTreeSet<&String> = modules
            .keys()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .filter_map(|m| m.last())
            .collect();
        let targets = edges.entry(module.clone()).or_default();
        for (base, segments) in paths(code) {
            let mut full: Vec<String> = match base.as_str() {
                "crate" => Vec::new(),
                "super" => module[..module.len().saturating_sub(1)].to_vec(),
                "self" => module.clone(),
                child if children.contains(&child.to_string()) => {
                    let mut full = module.clone();
                    full.push(child.to_string());
                    full
                }
                _ => continue,
            };
            let mut rest = segments.as_slice();
            while let Some(("super", tail)) = rest.split_first().map(|(s, t)| (s.as_str(), t)) {
                full.pop();
                rest = tail;
            }
            full.extend(rest.iter().cloned());
            let target = resolve(&full);
            if &target != module {
                targets.insert(target);
            }
        }
    }
    edges
}

/// The same edges between top-level modules (the crate root is `[]`).
fn fold_to_top(edges: &BTreeMap<Module, BTreeSet<Module>>) -> BTreeMap<Module, BTreeSet<Module>> {
    let top = |m: &Module| m.iter().take(1).cloned().collect::<Module>();
    let mut folded: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (from, tos) in edges {
        let from = top(from);
        for to in tos {
            let to = top(to);
            if to != from {
                folded.entry(from.clone()).or_default().insert(to);
            }
        }
        folded.entry(from).or_default();
    }
    folded
}

/// The strongly connected groups of more than one module.
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<String>> {
    let reaches = |from: &Module| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&Module, BTreeSet<Module>> =
        edges.keys().map(|m| (m, reaches(m))).collect();
    let mut groups: BTreeSet<Vec<String>> = BTreeSet::new();
    for (m, reached) in &reach {
        if !reached.contains(*m) {
            continue;
        }
        let group: Vec<String> = reached
            .iter()
            .filter(|other| reach.get(other).is_some_and(|r| r.contains(*m)))
            .map(|other| other.join("::"))
            .collect();
        groups.insert(group);
    }
    groups.into_iter().collect()
}
