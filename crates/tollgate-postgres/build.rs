//! Rebuilds the crate when a migration changes: `sqlx::migrate!` embeds the files at compile
//! time but cannot tell cargo to watch them on stable Rust.
#![allow(clippy::print_stdout)]

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
