//! The commands beside the server: `rekindle hash` and `rekindle explain` (the same core the server
//! uses, on files), `rekindle why` (on the live cluster), `rekindle migrate-values`, and the
//! `rekindle healthcheck` probe.

use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use serde_json::Value;

pub mod explain;
pub mod hash;
pub mod healthcheck;
pub mod migrate;
pub mod why;

pub use explain::{explain, run_explain};
pub use hash::{hash_document, run_hash, Hashed};
pub use healthcheck::run_healthcheck;

/// Reads every document of a YAML or JSON file (`-` is standard input); `List` objects are expanded.
pub fn read_documents(path: &Path) -> Result<Vec<Value>> {
    let mut text = String::new();
    if path == Path::new("-") {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
    } else {
        text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    }
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| anyhow!("{}: not valid YAML or JSON: {e}", path.display()))?;
    let mut out = Vec::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        if doc
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k.ends_with("List"))
        {
            out.extend(
                doc.get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            );
        } else {
            out.push(doc);
        }
    }
    Ok(out)
}

pub(crate) fn meta_str(doc: &Value, field: &str) -> Option<String> {
    doc.pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .map(String::from)
}
