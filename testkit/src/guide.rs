//! The operations guide's shell blocks, as tests run them.
//!
//! A block the tests run is marked in `deploy/README.md` by an HTML
//! comment on each side (invisible when the page is rendered):
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

/// The operations guide, as this build's tests see it.
pub const GUIDE: &str = include_str!("../../deploy/README.md");

/// The shell lines of the block marked `name` in the operations guide
/// (between `<!-- NAME start -->` and `<!-- NAME end -->`, without the
/// code fences), each ending in a newline. Panics, naming the mark, if
/// either mark is missing or the block is empty: a test that runs a
/// block must fail when the guide loses it.
pub fn block(name: &str) -> String {
    block_in(GUIDE, name)
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
    fn the_guide_s_marked_blocks_are_found() {
        for name in [
            "tls-recipe",
            "backup-save",
            "backup-restore",
            "majority-drill",
        ] {
            assert!(!block(name).is_empty(), "{name}");
        }
    }
}
