//! The tables of docs/behaviour.md, for the tests that hold the code to them.

const DOC: &str = include_str!("../../docs/behaviour.md");

/// The rows of the first table under the heading starting `## {section}`, below its header, each
/// cell trimmed and unquoted from its backticks.
pub fn table(section: &str) -> Vec<Vec<String>> {
    let heading = format!("## {section}");
    let body = DOC
        .split("\n## ")
        .find(|s| format!("## {s}").starts_with(&heading))
        .unwrap_or_else(|| panic!("no section {heading} in docs/behaviour.md"));
    let rows: Vec<Vec<String>> = body
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect()
        })
        .collect();
    assert!(rows.len() > 2, "no table in {heading}");
    rows.into_iter().skip(2).collect()
}
