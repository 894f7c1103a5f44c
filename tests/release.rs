//! The build operators deploy carries no test code (spec/layout.md — Ways of building): the
//! graph of `cargo build --release --locked -p tollgate --no-default-features` holds neither the
//! test kit nor any feature `test-support`, `fault-injection` or `mutation-*`, and no crate of the
//! workspace has the test kit as a normal dependency. Read from `cargo tree` (offline, no build).
#![cfg(test)]

use std::process::Command;

/// Features that only tests may turn on.
fn test_only(feature: &str) -> bool {
    feature == "test-support" || feature == "fault-injection" || feature.starts_with("mutation-")
}

/// `cargo tree` of the binary's package with `args`, one line per package: `name [features]`,
/// or `depth name [features]` with `--prefix depth`.
fn tree(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--offline", "--locked", "-f", "{p} [{f}]"])
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cargo tree failed: {err}");
    String::from_utf8(output.stdout).unwrap()
}

/// Every `(package name, its enabled features)` of a `--prefix none` tree.
fn packages(tree: &str) -> Vec<(String, Vec<String>)> {
    tree.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let name = line.split_whitespace().next().unwrap().to_string();
            let features = line
                .split_once('[')
                .and_then(|(_, rest)| rest.split_once(']'))
                .map(|(list, _)| list)
                .unwrap_or("");
            let features = features
                .split(',')
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .map(String::from)
                .collect();
            (name, features)
        })
        .collect()
}

/// What of `packages` is test code: the test kit, and each package's test-only features.
fn test_code(packages: &[(String, Vec<String>)]) -> Vec<String> {
    let mut found = Vec::new();
    for (name, features) in packages {
        if name == "tollgate-testkit" {
            found.push(name.clone());
        }
        for feature in features.iter().filter(|f| test_only(f)) {
            found.push(format!("{name}/{feature}"));
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn the_release_build_holds_no_test_code() {
    let release = packages(&tree(&[
        "-p",
        "tollgate",
        "--no-default-features",
        "-e",
        "no-dev",
        "--prefix",
        "none",
    ]));
    assert!(
        release.iter().any(|(name, _)| name == "tollgate-store"),
        "the release graph was not read: {release:?}"
    );
    assert_eq!(test_code(&release), Vec::<String>::new());
}

/// The default build (`cargo run -p tollgate -- demo`) differs only by the demo's fault wrapper,
/// and the same reading finds it: the check above is not blind.
#[test]
fn the_default_build_adds_only_the_demo_s_fault_wrapper() {
    let default = packages(&tree(&[
        "-p", "tollgate", "-e", "no-dev", "--prefix", "none",
    ]));
    assert_eq!(test_code(&default), ["tollgate-store/fault-injection"]);
    let with_tests = packages(&tree(&["-p", "tollgate", "--prefix", "none"]));
    assert!(
        test_code(&with_tests).contains(&"tollgate-testkit".to_string()),
        "the binary's tests build on the test kit"
    );
}

/// No crate of the workspace depends on the test kit outside its dev-dependencies: in the
/// workspace's graph without them, the test kit is only ever a root (its own member).
#[test]
fn no_crate_has_the_test_kit_as_a_dependency() {
    let workspace = tree(&["--workspace", "-e", "no-dev", "--prefix", "depth"]);
    let below_a_root: Vec<&str> = workspace
        .lines()
        .filter(|l| l.contains("tollgate-testkit ") && !l.starts_with("0tollgate-testkit"))
        .collect();
    assert!(
        workspace
            .lines()
            .any(|l| l.starts_with("0tollgate-testkit")),
        "the test kit is a workspace member: {workspace}"
    );
    assert_eq!(below_a_root, Vec::<&str>::new());
}
