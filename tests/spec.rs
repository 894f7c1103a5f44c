//! The specification in `spec/` is self-contained and defines every requirement id the repository
//! names (spec/layout.md — Tests).
//!
//! - Ids are named by function names with a lowercase id prefix (`fn sc_17_…`,
//!   `fn st_32_st_4_…`) and by text (`SC-17`) in every `.rs` file under `crates/`, `tests/` and
//!   `benches/`, and by text in `spec/*.md` and `README.md`. Every function name counts, not only
//!   those marked `#[test]`: the shared suites are plain functions that macros turn into tests.
//! - `spec/` defines an id with a bullet that starts with it in bold: `- **SC-17** …`. Every named
//!   id must be defined, and defined once.
//! - No `.rs`, `.md`, `.toml`, `.sh` or `.sql` file may cite a document that is not in the repository:
//!   the outside contract, design brief or requirement reading, a path into the shared folder
//!   (`../shared`, or the project machine's `/work/shared`), an absolute path, or a markdown link
//!   or `*.md` path that does not resolve. The captured stream fixtures in the shared folder
//!   (`../shared/fixtures`, `/work/shared/fixtures`) are test data, not a document: tests read
//!   them from there (never a copy in the repository) and fail when they are absent (SC-118).
//!
//! Needs no database and no network; the repository is found from `CARGO_MANIFEST_DIR`.
#![cfg(test)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Id prefixes as written in text.
const PREFIXES: [&str; 6] = ["SC", "ST", "SR", "RF", "TC", "H"];
/// Directories whose `.rs` files name ids.
const CODE_DIRS: [&str; 3] = ["crates", "tests", "benches"];
/// Extensions of the files whose citations are checked.
const CITING_EXTENSIONS: [&str; 5] = ["rs", "md", "toml", "sh", "sql"];
/// Directories never read (`node_modules`: the examples' installed npm packages).
const SKIPPED_DIRS: [&str; 3] = ["target", ".git", "node_modules"];
/// This file: its examples name ids and outside documents on purpose.
const THIS_FILE: &str = "tests/spec.rs";

/// `(path relative to the repository root, with '/', text)`.
type Files = Vec<(String, String)>;
/// Id → where it is named or defined.
type IdIndex = BTreeMap<String, Vec<String>>;

// ---- reading the repository -------------------------------------------------------------------

fn repository_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    fs::canonicalize(&root).expect("the repository root")
}

fn relative(root: &Path, path: &Path) -> String {
    let rest = path.strip_prefix(root).expect("a path under the root");
    let parts: Vec<_> = rest
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    parts.join("/")
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("a readable directory")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if path.is_dir() {
            if !name.is_some_and(|n| SKIPPED_DIRS.contains(&n.as_str())) {
                walk(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// Every file under `dir` (relative to `root`) whose extension is in `extensions`, except this
/// file.
fn read_files(root: &Path, dir: &str, extensions: &[&str]) -> Files {
    let start = if dir == "." {
        root.to_path_buf()
    } else {
        root.join(dir)
    };
    if !start.is_dir() {
        return Vec::new();
    }
    let mut paths = Vec::new();
    walk(&start, &mut paths);
    paths
        .into_iter()
        .filter(|p| {
            p.extension()
                .is_some_and(|x| extensions.contains(&x.to_string_lossy().as_ref()))
        })
        .map(|p| (relative(root, &p), p))
        .filter(|(rel, _)| rel != THIS_FILE)
        .map(|(rel, p)| {
            let text = fs::read_to_string(&p).unwrap_or_else(|e| panic!("{rel}: {e}"));
            (rel, text)
        })
        .collect()
}

/// The files whose ids must be defined: code, the spec itself and the README.
fn naming_files(root: &Path) -> Files {
    let mut files: Files = CODE_DIRS
        .iter()
        .flat_map(|dir| read_files(root, dir, &["rs"]))
        .collect();
    files.extend(read_files(root, "spec", &["md"]));
    let readme = fs::read_to_string(root.join("README.md")).expect("README.md");
    files.push(("README.md".into(), readme));
    files
}

// ---- ids --------------------------------------------------------------------------------------

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Whether `s` is exactly one id such as `SC-17`.
fn is_id(s: &str) -> bool {
    s.split_once('-').is_some_and(|(prefix, number)| {
        PREFIXES.contains(&prefix)
            && !number.is_empty()
            && number.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Ids written as text: a prefix, a hyphen and digits, standing as a word of their own
/// (`ST-1..ST-7` names ST-1 and ST-7; `SHA-256` names nothing).
fn text_ids(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut ids = BTreeSet::new();
    for (hyphen, _) in text.match_indices('-') {
        let digits = bytes[hyphen + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let end = hyphen + 1 + digits;
        if digits == 0 || bytes.get(end).is_some_and(|b| is_word_byte(*b)) {
            continue;
        }
        for prefix in PREFIXES {
            let Some(start) = hyphen.checked_sub(prefix.len()) else {
                continue;
            };
            let alone = start == 0 || !is_word_byte(bytes[start - 1]);
            if alone && &bytes[start..hyphen] == prefix.as_bytes() {
                ids.insert(text[start..end].to_string());
            }
        }
    }
    ids
}

/// Names of the functions defined in Rust source `text`.
fn function_names(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut names = Vec::new();
    for (at, _) in text.match_indices("fn ") {
        if at > 0 && is_word_byte(bytes[at - 1]) {
            continue;
        }
        let rest = text[at + 3..].trim_start();
        let end = rest.bytes().take_while(|b| is_word_byte(*b)).count();
        if end > 0 {
            names.push(&rest[..end]);
        }
    }
    names
}

/// The ids a function name carries as its lowercase prefix, in order:
/// `sc_17_x` → SC-17; `st_32_st_4_y` → ST-32, ST-4; `http_status` → none.
fn name_ids(name: &str) -> Vec<String> {
    let parts: Vec<&str> = name.split('_').collect();
    let mut ids = Vec::new();
    let mut i = 0;
    while i + 1 < parts.len() {
        let (prefix, number) = (parts[i], parts[i + 1]);
        let id = format!("{}-{number}", prefix.to_ascii_uppercase());
        if prefix != prefix.to_ascii_lowercase() || !is_id(&id) {
            break;
        }
        ids.push(id);
        i += 2;
    }
    ids
}

/// Every id named in `files`, with the files naming it.
fn ids_named(files: &[(String, String)]) -> IdIndex {
    let mut index = IdIndex::new();
    for (path, text) in files {
        let mut ids = text_ids(text);
        if path.ends_with(".rs") {
            ids.extend(function_names(text).into_iter().flat_map(name_ids));
        }
        for id in ids {
            index.entry(id).or_default().push(path.clone());
        }
    }
    index
}

/// Every id defined in `spec` by a `- **ID** …` bullet, with `path:line` of each definition.
fn ids_defined(spec: &[(String, String)]) -> IdIndex {
    let mut index = IdIndex::new();
    for (path, text) in spec {
        for (n, line) in text.lines().enumerate() {
            let Some(rest) = line.strip_prefix("- **") else {
                continue;
            };
            let Some((id, _)) = rest.split_once("**") else {
                continue;
            };
            if is_id(id) {
                index
                    .entry(id.to_string())
                    .or_default()
                    .push(format!("{path}:{}", n + 1));
            }
        }
    }
    index
}

/// The named ids that are not defined, each with where it is named.
fn undefined_ids(named: &IdIndex, defined: &IdIndex) -> Vec<String> {
    named
        .iter()
        .filter(|(id, _)| !defined.contains_key(*id))
        .map(|(id, paths)| format!("{id} (named in {})", paths.join(", ")))
        .collect()
}

/// The ids defined more than once, each with its definitions.
fn ids_defined_twice(defined: &IdIndex) -> Vec<String> {
    defined
        .iter()
        .filter(|(_, places)| places.len() > 1)
        .map(|(id, places)| format!("{id} (defined at {})", places.join(", ")))
        .collect()
}

// ---- citations --------------------------------------------------------------------------------

/// Whether `word` occurs in `line` as a word of its own, followed by one of `after` (any text
/// when `after` is empty).
fn has_word(line: &str, word: &str, after: &[&str]) -> bool {
    let bytes = line.as_bytes();
    line.match_indices(word).any(|(at, _)| {
        let end = at + word.len();
        let starts = at == 0 || !is_word_byte(bytes[at - 1]);
        let rest = &line[end..];
        let ends = !bytes.get(end).is_some_and(|b| is_word_byte(*b));
        starts && ends && (after.is_empty() || after.iter().any(|a| rest.starts_with(a)))
    })
}

/// The documents outside the repository that `line` cites.
fn outside_documents(line: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    if has_word(line, "CONTRACT", &[]) {
        found.push("the outside contract (CONTRACT)");
    }
    if has_word(line, "DESIGN", &[" §", "§", ".md"]) {
        found.push("the outside design brief (DESIGN)");
    }
    if has_word(line, "READING", &[]) {
        found.push("the outside requirement reading (READING)");
    }
    for folder in ["../shared", "/work/shared"] {
        let shared = line
            .match_indices(folder)
            .any(|(at, s)| !line[at + s.len()..].starts_with("/fixtures"));
        if shared {
            found.push("a path into the shared folder");
        }
    }
    found
}

/// Markdown link targets in `line`, without anchors; URLs and pure anchors are left out.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for (at, _) in line.match_indices("](") {
        let rest = &line[at + 2..];
        let Some(close) = rest.find(')') else {
            continue;
        };
        let target = rest[..close].split(' ').next().unwrap_or_default();
        let target = target.split('#').next().unwrap_or_default();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            targets.push(target.to_string());
        }
    }
    targets
}

/// Paths to markdown documents written out in `line` (`spec/journal.md`, `README.md`); those
/// inside URLs are left out.
fn document_paths(line: &str) -> Vec<String> {
    let bytes = line.as_bytes();
    let path_byte = |b: u8| is_word_byte(b) || matches!(b, b'.' | b'/' | b'-');
    let mut paths = Vec::new();
    for (at, _) in line.match_indices(".md") {
        let end = at + 3;
        if bytes.get(end).is_some_and(|b| is_word_byte(*b)) {
            continue;
        }
        let start = bytes[..at]
            .iter()
            .rposition(|b| !path_byte(*b))
            .map_or(0, |p| p + 1);
        let in_url = start > 0 && bytes[start - 1] == b':';
        if start < at && !in_url {
            paths.push(line[start..end].to_string());
        }
    }
    paths
}

/// `dir/target` with `.` and `..` resolved, or `None` when it leaves the repository.
fn normalize(dir: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in dir.split('/').chain(target.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

/// Whether `target`, cited in the file at `path`, names something in the repository: relative to
/// the citing file, or (`from_root`) relative to the repository root.
fn resolves(path: &str, target: &str, from_root: bool, exists: &dyn Fn(&str) -> bool) -> bool {
    if target.starts_with('/') {
        return false;
    }
    let dir = path.rsplit_once('/').map_or("", |(dir, _)| dir);
    let mut candidates = vec![normalize(dir, target)];
    if from_root {
        candidates.push(normalize("", target));
    }
    candidates.into_iter().flatten().any(|p| exists(&p))
}

/// What the file at `path` (relative to the root) cites that is not in the repository, one
/// message per citation with `path:line`. `exists` answers for root-relative paths.
fn dangling_citations(path: &str, text: &str, exists: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut problems = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = format!("{path}:{}", n + 1);
        for document in outside_documents(line) {
            problems.push(format!(
                "{at}: cites {document}, which is not in the repository"
            ));
        }
        let links = if path.ends_with(".md") {
            link_targets(line)
        } else {
            Vec::new()
        };
        for target in &links {
            if !resolves(path, target, false, exists) {
                problems.push(format!("{at}: link to {target}, which does not exist"));
            }
        }
        for target in document_paths(line) {
            if !links.contains(&target) && !resolves(path, &target, true, exists) {
                problems.push(format!("{at}: cites {target}, which does not exist"));
            }
        }
    }
    problems
}

// ---- the checks on this repository ------------------------------------------------------------

#[test]
fn every_id_named_in_code_or_spec_is_defined_in_spec() {
    let root = repository_root();
    let named = ids_named(&naming_files(&root));
    let defined = ids_defined(&read_files(&root, "spec", &["md"]));
    assert!(
        named.len() > 1 && defined.len() > 1,
        "no ids found: is {} the repository?",
        root.display()
    );
    let missing = undefined_ids(&named, &defined);
    assert!(
        missing.is_empty(),
        "{} id(s) named but not defined in spec/ (add a `- **ID** …` bullet to the Requirements \
         of the file that owns the topic):\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn no_id_is_defined_twice_in_spec() {
    let root = repository_root();
    let defined = ids_defined(&read_files(&root, "spec", &["md"]));
    let twice = ids_defined_twice(&defined);
    assert!(
        twice.is_empty(),
        "ids defined more than once in spec/:\n{}",
        twice.join("\n")
    );
}

#[test]
fn no_file_cites_a_document_outside_the_repository() {
    let root = repository_root();
    let files = read_files(&root, ".", &CITING_EXTENSIONS);
    assert!(files.iter().any(|(p, _)| p == "spec/README.md"));
    let exists = |p: &str| root.join(p).exists();
    let problems: Vec<String> = files
        .iter()
        .flat_map(|(path, text)| dangling_citations(path, text, &exists))
        .collect();
    assert!(
        problems.is_empty(),
        "citations of documents that are not in the repository (cite the spec file that holds \
         the text instead, e.g. `spec/journal.md — Lock order`):\n{}",
        problems.join("\n")
    );
}

// ---- the checker itself -----------------------------------------------------------------------

fn fake_files(list: &[(&str, &str)]) -> Files {
    list.iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn checker_reads_ids_from_test_function_names() {
    assert_eq!(name_ids("sc_17_settle_failure_rejects"), ids(&["SC-17"]));
    assert_eq!(
        name_ids("st_32_st_4_recovery_sends_nothing"),
        ids(&["ST-32", "ST-4"])
    );
    assert_eq!(
        name_ids("sr_1_tc_1_tc_3_structured_call"),
        ids(&["SR-1", "TC-1", "TC-3"])
    );
    assert_eq!(name_ids("h_7"), ids(&["H-7"]));
    assert!(name_ids("http_status_rejection_settles_zero").is_empty());
    assert!(name_ids("sc_x_17").is_empty());
    assert!(name_ids("Sc_17_upper").is_empty());
    let source = "#[tokio::test]\nasync fn st_32_st_4_x() {}\nfn helper() {}\npub fn h_3_y() {}";
    assert_eq!(function_names(source), ["st_32_st_4_x", "helper", "h_3_y"]);
}

#[test]
fn checker_reads_ids_written_as_text() {
    let found = text_ids("SC-17, ST-1..ST-7 (H-6); not SHA-256, XSC-1, SC-, SC-4a or sc-5");
    let expected: BTreeSet<String> = ["SC-17", "ST-1", "ST-7", "H-6"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, expected);
}

#[test]
fn checker_reports_an_id_missing_from_the_spec() {
    let code = fake_files(&[(
        "crates/x/tests/t.rs",
        "#[test]\nfn sc_17_failure_rejects() {}\n// shows SC-30 too\n",
    )]);
    let spec = fake_files(&[(
        "spec/journal.md",
        "## Requirements\n\n- **SC-17** A failed store write rejects the run.\n",
    )]);
    let missing = undefined_ids(&ids_named(&code), &ids_defined(&spec));
    assert_eq!(missing, ["SC-30 (named in crates/x/tests/t.rs)"]);
    let bullets_only = fake_files(&[("spec/a.md", "**SC-30** in prose is no definition\n")]);
    assert!(ids_defined(&bullets_only).is_empty());
}

#[test]
fn checker_reports_an_id_defined_twice() {
    let spec = fake_files(&[
        ("spec/a.md", "- **SC-17** One.\n- **SC-18** Two.\n"),
        ("spec/b.md", "- **SC-17** Again.\n"),
    ]);
    assert_eq!(
        ids_defined_twice(&ids_defined(&spec)),
        ["SC-17 (defined at spec/a.md:1, spec/b.md:1)"]
    );
}

#[test]
fn checker_reports_a_design_section_citation() {
    let anything = |_: &str| true;
    let source = "//! Journal writes (DESIGN §4).\nfn f() {}\n";
    let problems = dangling_citations("crates/x/src/journal.rs", source, &anything);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("crates/x/src/journal.rs:1: cites the outside design brief"));
    for outside in [
        "// the view (CONTRACT §2.4)",
        "see DESIGN.md",
        "ids point into READING.md",
        "read ../shared/CONTRACT.md",
        "at /work/notes/plan.md",
        "notes in /work/shared/mission/plan.txt",
    ] {
        assert!(
            !dangling_citations("src/a.rs", outside, &anything).is_empty(),
            "{outside}"
        );
    }
}

#[test]
fn checker_reports_a_link_to_a_missing_spec_file() {
    let present = |p: &str| ["spec/journal.md", "spec/README.md", "README.md"].contains(&p);
    let readme = "See `spec/nope.md` and `spec/journal.md`.\n";
    assert_eq!(
        dangling_citations("README.md", readme, &present),
        ["README.md:1: cites spec/nope.md, which does not exist"]
    );
    let index = "| [journal](journal.md) | [nope](nope.md#lock-order) |\n";
    assert_eq!(
        dangling_citations("spec/README.md", index, &present),
        ["spec/README.md:1: link to nope.md, which does not exist"]
    );
}

#[test]
fn checker_accepts_documents_in_the_repository_fixtures_and_urls() {
    let present = |p: &str| ["spec/journal.md", "spec/README.md", "ARCHITECTURE.md"].contains(&p);
    let fine = "\
//! Lock order: spec/journal.md — Lock order; index [spec](README.md), [web](https://x.org/a.md)
//! const OUTPUT_CONTRACT_VERSION_DEFAULT; see https://example.com/docs/README.md and ARCHITECTURE.md
    let dir = crate_dir().join(\"../../../shared/fixtures/streams\");
    PathBuf::from(\"/work/shared/fixtures/streams\"),
";
    assert_eq!(
        dangling_citations("spec/notes.rs", fine, &present),
        Vec::<String>::new()
    );
}

// ---- the architecture map ---------------------------------------------------------------------

/// Every repository path `text` names (`crates/…`, `tests/…`, `benches/…`, `migrations/…`,
/// `spec/…`), with `{a,b}` alternatives expanded.
fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for token in text.split(|c: char| c.is_whitespace() || "`()|;".contains(c)) {
        let token = token.trim_matches(|c: char| "`()|.:,".contains(c));
        if token.contains('*') {
            continue;
        }
        if !["crates/", "tests/", "benches/", "migrations/", "spec/"]
            .iter()
            .any(|p| token.starts_with(p))
        {
            continue;
        }
        match (token.find('{'), token.find('}')) {
            (Some(open), Some(close)) if open < close => {
                let (head, tail) = (&token[..open], &token[close + 1..]);
                for alt in token[open + 1..close].split(',') {
                    out.push(format!("{head}{alt}{tail}"));
                }
            }
            _ => out.push(token.to_string()),
        }
    }
    out
}

#[test]
fn architecture_map_names_only_files_that_exist() {
    let root = repository_root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md"))
        .expect("ARCHITECTURE.md at the repository root");
    let paths = named_paths(&text);
    assert!(paths.len() > 20, "the map names too few files: {paths:?}");
    let missing: Vec<&String> = paths.iter().filter(|p| !root.join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names missing files: {missing:?}"
    );
}

#[test]
fn checker_expands_alternatives_and_reports_a_missing_file() {
    let paths = named_paths("see `crates/a/src/{x,y}.rs` and (crates/b/src/z.rs).");
    assert_eq!(
        paths,
        [
            "crates/a/src/x.rs",
            "crates/a/src/y.rs",
            "crates/b/src/z.rs"
        ]
    );
    let root = repository_root();
    assert!(paths.iter().all(|p| !root.join(p).exists()));
}

// ---- module cycles ----------------------------------------------------------------------------

/// The top-level module a file under a crate's `src/` belongs to (`memory/roots.rs` → `memory`);
/// `None` for the crate root.
fn top_module(relative_to_src: &str) -> Option<String> {
    let first = relative_to_src.split('/').next()?;
    let name = first.trim_end_matches(".rs");
    (!["lib", "main"].contains(&name)).then(|| name.to_string())
}

/// The top-level modules one file's code refers to through `crate::…` (comments skipped).
fn crate_references(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let is_module = name.chars().next().is_some_and(|c| c.is_ascii_lowercase());
            let tail = &after[name.len()..];
            if is_module && (tail.starts_with("::") || tail.starts_with([';', ',', '}', ' '])) {
                out.insert(name);
            }
            if let Some(group) = after.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                out.extend(
                    inner
                        .split(',')
                        .map(|item| item.trim().split("::").next().unwrap_or("").to_string())
                        .filter(|m| m.chars().next().is_some_and(|c| c.is_ascii_lowercase())),
                );
            }
            rest = after;
        }
    }
    out
}

/// Module graph of one crate: top-level module → the top-level modules it refers to.
type ModuleGraph = BTreeMap<String, BTreeSet<String>>;

fn module_graph(files: &[(String, String)]) -> ModuleGraph {
    let mut graph = ModuleGraph::new();
    for (path, text) in files {
        let Some(from) = top_module(path) else {
            continue;
        };
        let refs = crate_references(text);
        let entry = graph.entry(from.clone()).or_default();
        entry.extend(refs.into_iter().filter(|to| *to != from));
    }
    graph
}

/// One cycle of the graph, if there is any (depth-first search).
fn find_cycle(graph: &ModuleGraph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &ModuleGraph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let root = repository_root();
    let mut cycles = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).expect("crates/") {
        let crate_dir = entry.expect("a crate").path();
        let src = format!("{}/src", relative(&root, &crate_dir));
        let files: Files = read_files(&root, &src, &["rs"])
            .into_iter()
            .map(|(path, text)| (path[src.len() + 1..].to_string(), text))
            .collect();
        if let Some(cycle) = find_cycle(&module_graph(&files)) {
            cycles.push(format!("{src}: {}", cycle.join(" → ")));
        }
    }
    assert!(cycles.is_empty(), "module import cycles: {cycles:#?}");
}

#[test]
fn checker_finds_a_module_cycle() {
    let files = fake_files(&[
        ("journal.rs", "use crate::roots::lock;"),
        ("roots.rs", "fn f() { crate::journal::lock(); }"),
        ("locks.rs", "use crate::{error::DbResultExt, rows};"),
        ("memory/roots.rs", "use super::Tables; use crate::rules;"),
    ]);
    let graph = module_graph(&files);
    assert_eq!(
        graph["locks"],
        BTreeSet::from(["error".into(), "rows".into()])
    );
    let cycle = find_cycle(&graph).expect("a cycle");
    assert_eq!(cycle, ["journal", "roots", "journal"]);
    let acyclic = fake_files(&[
        ("journal.rs", "use crate::locks;"),
        (
            "roots.rs",
            "use crate::locks; // crate::journal::x in a comment",
        ),
    ]);
    assert_eq!(find_cycle(&module_graph(&acyclic)), None);
}

// ---- SQL lives in tollgate-postgres and the test kit -----------------------------------------

/// Lines of `text` holding a string literal that starts like an SQL statement.
fn sql_lines(text: &str) -> Vec<usize> {
    const STATEMENTS: [&str; 8] = [
        "SELECT ",
        "INSERT INTO",
        "UPDATE ",
        "DELETE FROM",
        "CREATE ",
        "DROP ",
        "ALTER ",
        "WITH ",
    ];
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or("");
            code.split('"').skip(1).step_by(2).any(|literal| {
                STATEMENTS
                    .iter()
                    .any(|s| literal.trim_start().starts_with(s))
            })
        })
        .map(|(n, _)| n + 1)
        .collect()
}

/// The crates that may hold SQL: the product's statements, and the test kit's test SQL (fresh
/// databases, damage, the harness's statistics and seeding; spec/layout.md — Crates).
const SQL_CRATES: [&str; 2] = ["crates/tollgate-postgres/", "crates/tollgate-testkit/"];

#[test]
fn no_sql_outside_the_postgres_crate_and_the_test_kit() {
    let root = repository_root();
    let found: Vec<String> = CODE_DIRS
        .iter()
        .flat_map(|dir| read_files(&root, dir, &["rs"]))
        .filter(|(path, _)| !SQL_CRATES.iter().any(|c| path.starts_with(c)))
        .filter(|(path, _)| path != THIS_FILE)
        .flat_map(|(path, text)| {
            sql_lines(&text)
                .into_iter()
                .map(move |n| format!("{path}:{n}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "SQL outside tollgate-postgres and the test kit: {found:#?}"
    );
}

#[test]
fn checker_finds_an_sql_string() {
    let text = "let q = \"SELECT scope FROM api_keys\";\n// \"SELECT in a comment\"\nlet s = \"Selected\";\n";
    assert_eq!(sql_lines(text), [1]);
}

#[test]
fn no_module_is_included_by_path() {
    let root = repository_root();
    let attribute = ["#[", "path"].concat();
    let found: Vec<String> = CODE_DIRS
        .iter()
        .flat_map(|dir| read_files(&root, dir, &["rs"]))
        .filter(|(_, text)| text.lines().any(|l| l.trim_start().starts_with(&attribute)))
        .map(|(path, _)| path)
        .collect();
    assert!(found.is_empty(), "modules included by path: {found:?}");
}
