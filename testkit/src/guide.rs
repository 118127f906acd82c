//! The operations guide's shell blocks, as tests run them.
//!
//! The guide is the pages of `docs/operations/` ([`PAGES`]). A block the
//! tests run is marked in one of them by an HTML comment on each side
//! (invisible when the page is rendered):
//!
//! ~~~text
//! <!-- NAME start -->
//! ```sh
//! ...
//! ```
//! <!-- NAME end -->
//! ~~~
//!
//! [`block`] gives the commands between the marks, fences dropped, so a
//! test can run them as they are written, with only what names a machine
//! (addresses, paths, service managers) swapped for the test's own.

/// The operations guide, as this build's tests see it: each page's path
/// in the repository and its text.
pub const PAGES: &[(&str, &str)] = &[
    (
        "docs/operations/README.md",
        include_str!("../../docs/operations/README.md"),
    ),
    (
        "docs/operations/deploy.md",
        include_str!("../../docs/operations/deploy.md"),
    ),
    (
        "docs/operations/configuration.md",
        include_str!("../../docs/operations/configuration.md"),
    ),
    (
        "docs/operations/tls-and-acl.md",
        include_str!("../../docs/operations/tls-and-acl.md"),
    ),
    (
        "docs/operations/membership.md",
        include_str!("../../docs/operations/membership.md"),
    ),
    (
        "docs/operations/backup-and-recovery.md",
        include_str!("../../docs/operations/backup-and-recovery.md"),
    ),
    (
        "docs/operations/upgrades.md",
        include_str!("../../docs/operations/upgrades.md"),
    ),
    (
        "docs/operations/monitoring.md",
        include_str!("../../docs/operations/monitoring.md"),
    ),
    (
        "docs/operations/console.md",
        include_str!("../../docs/operations/console.md"),
    ),
];

/// The path of the page of [`PAGES`] that holds the block marked `name`.
/// Panics, naming the mark, if no page has its start mark, or more than
/// one does.
pub fn page_of(name: &str) -> &'static str {
    let start = format!("<!-- {name} start -->");
    let pages: Vec<&str> = PAGES
        .iter()
        .filter(|(_, text)| text.contains(&start))
        .map(|(path, _)| *path)
        .collect();
    match pages.as_slice() {
        [path] => path,
        [] => panic!("the guide has no `{start}` (in none of docs/operations/*.md)"),
        more => panic!("the guide has `{start}` in more than one page: {more:?}"),
    }
}

/// The shell lines of the block marked `name` in the operations guide
/// (between `<!-- NAME start -->` and `<!-- NAME end -->`, without the
/// code fences), each ending in a newline, from whichever page of
/// [`PAGES`] holds it. Panics, naming the mark, if either mark is
/// missing, the start mark is in more than one page, or the block is
/// empty: a test that runs a block must fail when the guide loses it.
pub fn block(name: &str) -> String {
    let path = page_of(name);
    let text = PAGES
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, text)| *text)
        .expect("page_of names a page of PAGES");
    block_in(text, name)
}

/// [`block`] of another Markdown text.
pub fn block_in(text: &str, name: &str) -> String {
    let start = format!("<!-- {name} start -->");
    let end = format!("<!-- {name} end -->");
    let from = text
        .find(&start)
        .unwrap_or_else(|| panic!("the guide has no `{start}`"))
        + start.len();
    let to = from
        + text[from..]
            .find(&end)
            .unwrap_or_else(|| panic!("the guide has no `{end}` after its start"));
    let lines: String = text[from..to]
        .lines()
        .filter(|l| !l.trim_start().starts_with("```") && !l.trim().is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!lines.is_empty(), "the guide's block `{name}` is empty");
    lines
}

/// The steps of a block whose steps are numbered comments (`# 1. ...`,
/// `# 2. ...`): for each, its number and its lines (the comment lines
/// included, so the step runs as written).
pub fn steps(block: &str) -> Vec<(u32, String)> {
    let mut steps: Vec<(u32, String)> = Vec::new();
    for line in block.lines() {
        let number = line
            .strip_prefix("# ")
            .and_then(|rest| rest.split_once(". "))
            .and_then(|(n, _)| n.parse::<u32>().ok());
        match (number, steps.last_mut()) {
            (Some(n), _) => steps.push((n, format!("{line}\n"))),
            (None, Some((_, lines))) => {
                lines.push_str(line);
                lines.push('\n');
            }
            (None, None) => panic!("a line before the first numbered step: {line}"),
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "intro\n\n<!-- demo start -->\n```sh\n# 1. One.\necho a\n#    more\n\n# 2. Two.\necho b\n```\n<!-- demo end -->\nafter\n";

    #[test]
    fn a_block_is_its_lines_without_fences() {
        assert_eq!(
            block_in(TEXT, "demo"),
            "# 1. One.\necho a\n#    more\n# 2. Two.\necho b\n"
        );
    }

    #[test]
    fn steps_split_at_numbered_comments() {
        let steps = steps(&block_in(TEXT, "demo"));
        assert_eq!(
            steps,
            vec![
                (1, "# 1. One.\necho a\n#    more\n".to_string()),
                (2, "# 2. Two.\necho b\n".to_string()),
            ]
        );
    }

    #[test]
    #[should_panic(expected = "no `<!-- other start -->`")]
    fn a_missing_mark_fails_the_test() {
        block_in(TEXT, "other");
    }

    #[test]
    #[should_panic(expected = "the guide has no `<!-- no-such-block start -->`")]
    fn a_mark_in_no_page_fails_the_test() {
        block("no-such-block");
    }

    #[test]
    fn the_guide_s_marked_blocks_are_found() {
        for (name, page) in [
            ("tls-recipe", "docs/operations/tls-and-acl.md"),
            ("k8s-replace", "docs/operations/membership.md"),
            ("backup-save", "docs/operations/backup-and-recovery.md"),
            ("backup-restore", "docs/operations/backup-and-recovery.md"),
            ("majority-drill", "docs/operations/backup-and-recovery.md"),
        ] {
            assert_eq!(page_of(name), page, "{name}");
            assert!(!block(name).is_empty(), "{name}");
        }
    }
}
