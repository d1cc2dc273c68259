//! `/metrics` in the format the scraper asks for: OpenMetrics when its `Accept` names it (Prometheus
//! does), else the classic text format 0.0.4 that Reloader serves (curl, older agents).
//!
//! One name needs care. Reloader's `reloader_reload_executed_total_by_namespace` is a counter whose
//! name does not end in `_total`: the classic format types it `counter` under that exact name, and
//! OpenMetrics, where a counter's samples must end in `_total`, types it `unknown` under that name, so
//! queries written against Reloader find it in both.

use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::registry::Registry;

pub const BY_NAMESPACE: &str = "reloader_reload_executed_total_by_namespace";

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Classic,
}

impl Format {
    /// From the request's `Accept` header.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Self::OpenMetrics,
            _ => Self::Classic,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => OPENMETRICS,
            Self::Classic => prometheus_text::CONTENT_TYPE,
        }
    }
}

/// The registry's metrics in `format`.
pub fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    match format {
        Format::OpenMetrics => text::encode(&mut out, registry)?,
        Format::Classic => prometheus_text::encode(&mut out, registry)?,
    }
    let suffixed = format!("{BY_NAMESPACE}_total");
    if !out.contains(&suffixed) {
        return Ok(out);
    }
    Ok(out
        .lines()
        .map(|line| {
            let line = line.replace(&suffixed, BY_NAMESPACE);
            if format == Format::OpenMetrics && line == format!("# TYPE {BY_NAMESPACE} counter") {
                format!("# TYPE {BY_NAMESPACE} unknown")
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::WorkloadKind;
    use crate::metrics::Metrics;

    fn registry() -> Registry {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry, true);
        m.reload_done("team-a", WorkloadKind::Deployment, true, 0.2);
        m.reload_done("team-a", WorkloadKind::Deployment, true, 0.2);
        registry
    }

    #[test]
    fn prometheus_gets_openmetrics_and_everyone_else_the_classic_format() {
        let prometheus =
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Classic);
        assert_eq!(Format::negotiate(None), Format::Classic);
        assert!(Format::Classic
            .content_type()
            .starts_with("text/plain; version=0.0.4"));
    }

    #[test]
    fn the_by_namespace_counter_keeps_reloaders_exact_name_in_both_formats() {
        let classic = encode(&registry(), Format::Classic).unwrap();
        assert!(
            classic.contains(&format!("# TYPE {BY_NAMESPACE} counter\n")),
            "{classic}"
        );
        assert!(classic.contains(&format!(
            "{BY_NAMESPACE}{{success=\"true\",namespace=\"team-a\"}} 2\n"
        )));
        assert!(classic.contains("# TYPE reloader_reload_executed_total counter\n"));
        assert!(!classic.contains("# EOF"));
        let open = encode(&registry(), Format::OpenMetrics).unwrap();
        assert!(
            open.contains(&format!("# TYPE {BY_NAMESPACE} unknown\n")),
            "{open}"
        );
        assert!(open.contains(&format!(
            "{BY_NAMESPACE}{{success=\"true\",namespace=\"team-a\"}} 2\n"
        )));
        assert!(open.ends_with("# EOF\n"));
    }
}
