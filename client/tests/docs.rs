//! The merchant's guide (`docs/client.md`) shows the same integration the crate's front
//! page compiles as a doctest: the two cannot drift apart.

fn read(relative: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The crate example as a reader sees it: `//! ` taken off, hidden `# ` lines left out.
fn crate_example() -> String {
    let lib = read("src/lib.rs");
    let doc: Vec<&str> = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| {
            l.strip_prefix("//! ")
                .unwrap_or(l.trim_start_matches("//!"))
        })
        .collect();
    let start = doc
        .iter()
        .position(|l| *l == "```no_run")
        .expect("the crate's example");
    doc[start + 1..]
        .iter()
        .take_while(|l| **l != "```")
        .filter(|l| !l.starts_with("# ") && **l != "#")
        .map(|l| format!("{l}\n"))
        .collect()
}

fn guide_example() -> String {
    let guide = read("../docs/client.md");
    let library = guide.find("## Library").expect("a Library section");
    let block = &guide[library..];
    let start = block.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let end = block[start..].find("```").expect("its end");
    block[start..start + end].to_owned()
}

#[test]
fn the_guides_integration_is_the_crates_compiled_example() {
    assert_eq!(guide_example(), crate_example());
}
