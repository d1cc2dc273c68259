//! The standard process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...),
//! read from /proc on each scrape. prometheus-client has no collector for them; the names and meanings
//! are those of the Go and Python clients, so dashboards written for any exporter work.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// What one scrape reads; `None` where /proc does not say (then the series is left out).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<f64>,
    pub virtual_bytes: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
}

/// Parses `/proc/self/stat` (with the clock tick and page size) and `btime` from `/proc/stat`.
pub fn parse_stat(
    stat: &str,
    proc_stat: &str,
    ticks_per_second: f64,
    page_size: f64,
) -> ProcessStats {
    // Fields after the command name, which is in parentheses and may itself contain spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // `fields[0]` is field 3 of proc(5) (state): field n is at n - 3.
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    let boot_time = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    ProcessStats {
        cpu_seconds: field(14)
            .zip(field(15))
            .map(|(utime, stime)| (utime + stime) / ticks_per_second),
        start_time_seconds: field(22)
            .zip(boot_time)
            .map(|(start, boot)| boot + start / ticks_per_second),
        virtual_bytes: field(23),
        resident_bytes: field(24).map(|pages| pages * page_size),
        ..Default::default()
    }
}

fn read() -> ProcessStats {
    // SAFETY: sysconf and getrlimit only read process-wide values into the locals given.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let proc_stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let mut stats = parse_stat(&stat, &proc_stat, ticks.max(1) as f64, page.max(1) as f64);
    stats.open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as f64);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as above; `limit` outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        stats.max_fds = Some(limit.rlim_cur as f64);
    }
    stats
}

#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = read();
        if let Some(v) = stats.cpu_seconds {
            let counter = ConstCounter::new(v);
            let m = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                counter.metric_type(),
            )?;
            counter.encode(m)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                stats.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stats.virtual_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                stats.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                stats.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                stats.max_fds,
            ),
        ];
        encode_gauges(
            &mut encoder,
            gauges
                .into_iter()
                .filter_map(|(name, help, value)| Some((name, help, value?))),
        )
    }
}

/// Encodes constant gauges (name, help, value) read at scrape time, for the collectors.
pub fn encode_gauges<'a, N>(
    encoder: &mut DescriptorEncoder,
    gauges: impl IntoIterator<Item = (&'a str, &'a str, N)>,
) -> Result<(), std::fmt::Error>
where
    ConstGauge<N>: EncodeMetric,
{
    for (name, help, value) in gauges {
        let gauge = ConstGauge::new(value);
        let m = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
        gauge.encode(m)?;
    }
    Ok(())
}

/// One gauge family with one label, a series per value.
pub fn encode_labelled_gauges<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'a str,
    series: impl IntoIterator<Item = (&'a str, i64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value, n) in series {
        let labels = [(label, value)];
        let m = family.encode_family(&labels)?;
        ConstGauge::new(n).encode(m)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_memory_and_start_time_from_proc() {
        // A command name with spaces and parentheses, as proc(5) allows.
        let stat = "4242 (re kindle) (x)) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 50 0 0 20 0 9 0 1000 123456789 2048 18446744073709551615";
        let stats = parse_stat(stat, "cpu 1 2 3\nbtime 1700000000\n", 100.0, 4096.0);
        assert_eq!(stats.cpu_seconds, Some(3.0));
        assert_eq!(stats.start_time_seconds, Some(1_700_000_010.0));
        assert_eq!(stats.virtual_bytes, Some(123_456_789.0));
        assert_eq!(stats.resident_bytes, Some(2048.0 * 4096.0));
    }

    #[test]
    fn this_process_reports_every_series() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        for series in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(out.contains(series), "{series} missing in\n{out}");
        }
        let rss: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(rss > 1e6, "a test binary uses more than 1 MB: {rss}");
    }
}
