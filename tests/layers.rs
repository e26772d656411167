//! The layering ARCHITECTURE.md states, held: each module of `src/` uses only modules of the
//! layers before its own. A reference up the pipeline (the plan asking the emitter, the tape
//! asking a program) fails here with the file and the path it names.
//!
//! References are read from the source: every `crate::` path (and `use crate::{...}` group),
//! and inside `jit/` the `super::` paths between its stages. Comments, strings and unit-test
//! modules (`#[cfg(test)] mod ... { }`, `tests.rs`) are skipped: a test may build its inputs
//! with anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module may use the modules of earlier layers only.
const LAYERS: &[&[&str]] = &[
    &["error", "aligned", "finite"],
    &["op"],
    &["graph"],
    &["nn", "datasets"],
    &["tape"],
    &["anomaly", "optim", "samples"],
    // Running a tape: what users call, what backends supply, minibatches over any backend.
    &["program"],
    &["minibatch"],
    &["interp", "checkpoint"],
    // The JIT's first tier: the tape as runs of one op, no compiler.
    &["kernels"],
    // Compiling a tape: structure, decisions, then LLVM.
    &["passes"],
    &["plan"],
    // The persistent compile cache: a tape's key and the entries on disk.
    &["jit::cache"],
    &["jit::options", "jit::abi"],
    &["jit::ir_arith"],
    &["jit::emit"],
    &["jit::compiler"],
    &["jit::engine"],
    // The deployment form: the plan's modules linked into one object with a C interface.
    &["jit::export"],
    &["jit"],
    &["dot"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// A file's module path: `plan/order.rs` -> plan::order, `plan/mod.rs` -> plan.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The layer a module path belongs to: its top-level module, or `jit::X` for jit's stages.
fn module_key(path: &[String]) -> String {
    match path {
        [jit, stage, ..] if jit == "jit" && layer_of(&format!("jit::{stage}")).is_some() => {
            format!("jit::{stage}")
        }
        [first, ..] => first.clone(),
        [] => String::new(),
    }
}

fn module_of(relative: &Path) -> String {
    module_key(&module_path(relative))
}

/// `text` without comments, string and char literals, or `#[cfg(test)]` modules.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if text[i..].starts_with("//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if text[i..].starts_with("/*") {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            i = end;
        } else if text[i..].starts_with("r#\"") {
            let end = text[i + 3..].find("\"#").map_or(b.len(), |e| i + 3 + e + 2);
            i = end;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x', '\n'); a lifetime ('a) is left alone.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    strip_test_modules(&out)
}

fn strip_test_modules(code: &str) -> String {
    const ATTRIBUTE: &str = "#[cfg(test)]";
    let mut code = code.to_string();
    while let Some(at) = code.find(ATTRIBUTE) {
        let after = at + ATTRIBUTE.len();
        let item = code[after..].trim_start();
        let start = code.len() - item.len();
        let end = match (item.starts_with("mod "), item.find('{'), item.find(';')) {
            (true, Some(open), semi) if !semi.is_some_and(|s| s < open) => {
                start + open + matching_brace(&item[open..])
            }
            (true, _, Some(semi)) => start + semi + 1,
            // Another item under cfg(test) stays; only the attribute goes.
            _ => after,
        };
        code.replace_range(at..end, " ");
    }
    code
}

/// The length of the braced group `text` starts with, braces included.
fn matching_brace(text: &str) -> usize {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// The first names of the paths a `use` group lists: `{a, b::c, d::{e}}` -> a, b, d.
fn group_heads(group: &str) -> Vec<String> {
    let inner = &group[1..group.len() - 1];
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item = String::new();
    for c in inner.chars().chain([',']) {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                let head: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !head.is_empty() {
                    heads.push(head);
                }
                item.clear();
                continue;
            }
            _ => {}
        }
        if depth == 0 {
            item.push(c);
        }
    }
    heads
}

/// Every name that follows `prefix` in `code` (each head of a group).
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find(prefix) {
        let start = from + at;
        let before = code[..start].chars().next_back();
        from = start + prefix.len();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // part of a longer path (`a::crate::`, `super::super::`)
        }
        if code[..start].ends_with("(in ") {
            continue; // a visibility (`pub(in crate::jit::emit)`), not a use
        }
        let rest = &code[from..];
        if rest.starts_with('{') {
            names.extend(group_heads(&rest[..matching_brace(rest)]));
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            // `crate::jit::X` names one of jit's stages: the `crate::jit::` pass reads it.
            let a_stage = prefix == "crate::" && name == "jit" && rest[3..].starts_with("::");
            if !name.is_empty() && !a_stage {
                names.push(name);
            }
        }
    }
    names
}

/// The module paths that `super::` paths name from the module at `path` (`super::super::x`
/// in plan::order is x).
fn names_after_super(code: &str, path: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("super::") {
        let start = from + at;
        from = start + "super::".len();
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut ups = 1;
        while code[from..].starts_with("super::") {
            ups += 1;
            from += "super::".len();
        }
        let Some(base) = path.len().checked_sub(ups) else {
            continue;
        };
        let rest = &code[from..];
        let names = if rest.starts_with('{') {
            group_heads(&rest[..matching_brace(rest)])
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            vec![name]
        };
        for name in names.into_iter().filter(|n| !n.is_empty() && n != "self") {
            let mut target = path[..base].to_vec();
            target.push(name);
            found.push(target);
        }
    }
    found
}

/// What lib.rs re-exports (`pub use m::{A, B}`): name -> module.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    // (One item per `pub use ... ;`, which rustfmt may spread over several lines.)
    for item in lib.split(';') {
        let item: String = item.split_whitespace().collect::<Vec<_>>().join(" ");
        let Some(at) = item.find("pub use ") else {
            continue;
        };
        let rest = item[at + "pub use ".len()..]
            .replace("{ ", "{")
            .replace(" }", "}");
        let rest = rest.as_str();
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        let names = if names.starts_with('{') {
            group_heads(names)
        } else {
            vec![names.to_string()]
        };
        for name in names {
            map.insert(name, module.to_string());
        }
    }
    map
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// (file, module it names) for every reference in `src/`, but those within a module.
fn references() -> Vec<(String, String, String)> {
    let src = src();
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let reexported = reexports(&lib);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut refs = Vec::new();
    for path in files {
        let relative = path.strip_prefix(&src).unwrap().to_path_buf();
        if relative == Path::new("lib.rs") || relative.file_name().unwrap() == "tests.rs" {
            continue;
        }
        let from = module_of(&relative);
        let code = code_only(&std::fs::read_to_string(&path).unwrap());
        let mut named = names_after(&code, "crate::");
        named.extend(
            names_after_super(&code, &module_path(&relative))
                .into_iter()
                .map(|path| module_key(&path)),
        );
        named.extend(
            names_after(&code, "crate::jit::")
                .into_iter()
                .map(|n| module_key(&["jit".to_string(), n])),
        );
        let file = relative.display().to_string();
        for to in named {
            let to = reexported.get(&to).cloned().unwrap_or(to);
            if to != from {
                refs.push((file.clone(), from.clone(), to));
            }
        }
    }
    refs
}

#[test]
fn every_module_has_a_layer() {
    let src = src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for path in files {
        let relative = path.strip_prefix(&src).unwrap();
        if relative == Path::new("lib.rs") {
            continue;
        }
        let module = module_of(relative);
        assert!(
            layer_of(&module).is_some(),
            "{} is in module `{module}`, which tests/layers.rs's LAYERS (and ARCHITECTURE.md's \
             layers) do not place",
            relative.display()
        );
    }
}

#[test]
fn imports_run_down_the_layers_only() {
    let refs = references();
    assert!(
        refs.len() > 100,
        "the reader found too few references to trust"
    );
    let mut upward = Vec::new();
    for (file, from, to) in refs {
        let (Some(a), Some(b)) = (layer_of(&from), layer_of(&to)) else {
            continue; // a crate-root item (`crate::Result` is resolved above)
        };
        if b >= a {
            upward.push(format!(
                "{file} (`{from}`, layer {a}) uses `{to}` (layer {b})"
            ));
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports that run up (or across) the layers:\n  {}",
        upward.join("\n  ")
    );
}

#[test]
fn the_reader_sees_paths_groups_and_skips_comments_and_tests() {
    let code = code_only(
        "use crate::{a, b::c, d::{e, f}};\n// crate::comment\nlet s = \"crate::string\";\n\
         #[cfg(test)]\nmod tests { use crate::hidden; }\nfn f<'a>() { crate::g::h(); }\n\
         pub(in crate::seen) fn v() {}\n",
    );
    let mut names = names_after(&code, "crate::");
    names.sort();
    assert_eq!(names, ["a", "b", "d", "g"]);
}
