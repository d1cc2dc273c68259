//! The load driver's command line: which part to run, against which binaries, and the sizes. Every
//! size is a flag and also read from its `REKINDLE_BENCH_*` variable (what `just bench` passes), so
//! a value that does not parse stops the run naming it instead of falling back to a default.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Parser, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "load",
    about = "rekindle's load scenarios against the local control plane (bench/README.md)"
)]
pub struct Args {
    /// Run the comparable scenarios (S1, S2, S3, S5, S7), or S5's rounds with `--only s5`, a second
    /// time against this rekindle-compatible binary.
    #[arg(long, value_parser = existing_file)]
    pub vs: Option<PathBuf>,
    /// Run one part alone, writing bench/results/<part>.{json,md}.
    #[arg(long, value_enum)]
    pub only: Option<Part>,
    /// Where reports are written (created if missing).
    #[arg(long, env = "REKINDLE_BENCH_OUT")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub sizes: Sizes,
}

/// A controller S10 measures.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum S10Controller {
    Rekindle,
    Reloader,
}

impl S10Controller {
    pub fn name(self) -> &'static str {
        match self {
            S10Controller::Rekindle => "rekindle",
            S10Controller::Reloader => "Reloader",
        }
    }
}

/// A part run alone with `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// S3 at 1,000 and 5,000 Deployments, S8 and S9.
    Writer,
    /// The webhook alone, in rounds, taking turns with `--vs`.
    S5,
    /// The full-size start-up.
    S6,
    /// The writer at a fixed pace against a bare client.
    S8,
    /// Index memory per object.
    S9,
    /// SecretProviderClassPodStatus objects: memory and CPU.
    Csi,
    /// Pod-restart walks: time and requests per pod replaced.
    Restarts,
    /// A cluster grown to 100,000 Deployments, rekindle and Stakater Reloader side by side.
    S10,
}

impl Part {
    pub fn name(self) -> &'static str {
        match self {
            Part::Writer => "writer",
            Part::S5 => "s5",
            Part::S6 => "s6",
            Part::S8 => "s8",
            Part::S9 => "s9",
            Part::Csi => "csi",
            Part::Restarts => "restarts",
            Part::S10 => "s10",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct Sizes {
    /// S1: ConfigMap/Deployment pairs.
    #[arg(long, env = "REKINDLE_BENCH_S1_PAIRS", default_value_t = 100)]
    pub s1_pairs: usize,
    /// S1: changes.
    #[arg(long, env = "REKINDLE_BENCH_S1_UPDATES", default_value_t = 500)]
    pub s1_updates: usize,
    /// S2: Deployments sharing one ConfigMap.
    #[arg(long, env = "REKINDLE_BENCH_S2_WORKLOADS", default_value_t = 500)]
    pub s2_workloads: usize,
    /// S3: Deployments.
    #[arg(long, env = "REKINDLE_BENCH_S3_WORKLOADS", default_value_t = 5000)]
    pub s3_workloads: usize,
    /// S4: Secret counts, each run at a quarter, a half and the whole.
    #[arg(
        long,
        env = "REKINDLE_BENCH_S4_SECRETS",
        value_delimiter = ',',
        default_value = "20000"
    )]
    pub s4_secrets: Vec<usize>,
    /// S5: seconds per load step.
    #[arg(long, env = "REKINDLE_BENCH_S5_SECONDS", default_value_t = 10)]
    pub s5_seconds: u64,
    /// S5 alone: rounds.
    #[arg(long, env = "REKINDLE_BENCH_S5_ROUNDS", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub s5_rounds: u64,
    /// S6: Deployments (each with its own ConfigMap); 0 skips the full-size S6.
    #[arg(long, env = "REKINDLE_BENCH_S6_WORKLOADS", default_value_t = 10_000)]
    pub s6_workloads: usize,
    /// S6: resources in all (the ones beyond a ConfigMap per Deployment are 8 KiB Secrets).
    #[arg(long, env = "REKINDLE_BENCH_S6_RESOURCES", default_value_t = 25_000)]
    pub s6_resources: usize,
    /// S6: start-ups timed over the same objects (the median is reported).
    #[arg(long, env = "REKINDLE_BENCH_S6_STARTS", default_value_t = 3)]
    pub s6_starts: usize,
    /// S6 alone: time paged lists after streaming ones.
    #[arg(long, env = "REKINDLE_BENCH_S6_PAGED", default_value_t = true, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub s6_paged: bool,
    /// S6: leave the objects in their namespace.
    #[arg(long, env = "REKINDLE_BENCH_S6_KEEP", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub s6_keep: bool,
    /// S6: time each start for this binary too, the two taking turns to go first.
    #[arg(long, env = "REKINDLE_BENCH_S6_VS", value_parser = existing_file)]
    pub s6_vs: Option<PathBuf>,
    /// S7: seconds of the no-op storm.
    #[arg(long, env = "REKINDLE_BENCH_S7_SECONDS", default_value_t = 30)]
    pub s7_seconds: u64,
    /// S8: rounds of the paced runs (the writers' order rotated each round).
    #[arg(long, env = "REKINDLE_BENCH_S8_ROUNDS", default_value_t = 3)]
    pub s8_rounds: usize,
    /// S8: changes per run at 10/s (a fifth of it at 2/s).
    #[arg(long, env = "REKINDLE_BENCH_S8_UPDATES", default_value_t = 300)]
    pub s8_updates: usize,
    /// S9: objects added per step.
    #[arg(long, env = "REKINDLE_BENCH_S9_STEP", default_value_t = 10_000)]
    pub s9_step: usize,
    /// `--only csi`: status objects.
    #[arg(long, env = "REKINDLE_BENCH_CSI_STATUSES", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub csi_statuses: u64,
    /// `--only restarts`: StatefulSets walked at once.
    #[arg(long, env = "REKINDLE_BENCH_RESTART_SETS", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub restart_sets: u64,
    /// `--only restarts`: pods of each.
    #[arg(long, env = "REKINDLE_BENCH_RESTART_PODS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub restart_pods: u64,
    /// S10: the sizes the cluster grows through, in Deployments (2.5 ConfigMaps and Secrets each).
    #[arg(
        long,
        env = "REKINDLE_BENCH_S10_WORKLOADS",
        value_delimiter = ',',
        default_value = "10000,30000,100000",
        value_parser = clap::value_parser!(usize)
    )]
    pub s10_workloads: Vec<usize>,
    /// S10: namespaces the objects are spread over (the first Deployment of each is a probe).
    #[arg(long, env = "REKINDLE_BENCH_S10_NAMESPACES", default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(3..))]
    pub s10_namespaces: usize,
    /// S10: changes per paced round.
    #[arg(long, env = "REKINDLE_BENCH_S10_CHANGES", default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub s10_changes: usize,
    /// S10: paced rounds per controller and size, back to back, each of `--s10-changes` (the spread
    /// of the latency ratios within one process; pooled for the report's ratios).
    #[arg(long, env = "REKINDLE_BENCH_S10_ROUNDS", default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub s10_rounds: usize,
    /// S10: changes per second.
    #[arg(long, env = "REKINDLE_BENCH_S10_RATE", default_value_t = 10.0)]
    pub s10_rate: f64,
    /// S10: rekindle's `--consistency-interval` (so that its periodic pass is measured while it runs).
    #[arg(
        long,
        env = "REKINDLE_BENCH_S10_CONSISTENCY_INTERVAL",
        default_value = "60s"
    )]
    pub s10_consistency_interval: String,
    /// S10: the Reloader binary (default: built by `e2e/scripts/build-companions.sh reloader`).
    #[arg(long, env = "REKINDLE_BENCH_S10_RELOADER", value_parser = existing_file)]
    pub s10_reloader: Option<PathBuf>,
    /// S10: the controllers measured at each size, in turn (rekindle alone for a quicker look at it).
    #[arg(
        long,
        env = "REKINDLE_BENCH_S10_CONTROLLERS",
        value_enum,
        value_delimiter = ',',
        default_value = "rekindle,reloader"
    )]
    pub s10_controllers: Vec<S10Controller>,
    /// S10: leave the objects in their namespaces (a later run reuses them).
    #[arg(long, env = "REKINDLE_BENCH_S10_KEEP", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub s10_keep: bool,
}

impl Args {
    /// Where reports are written: `--out`, else bench/results; created if missing.
    pub fn results_dir(&self) -> anyhow::Result<PathBuf> {
        let dir = self
            .out
            .clone()
            .unwrap_or_else(|| e2e::root().join("bench/results"));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}

fn existing_file(path: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(path);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{}: no such file", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_bad_values_are_refused() {
        let args = Args::try_parse_from(["load", "--only", "s8", "--s8-rounds", "2"]).unwrap();
        assert_eq!(args.only, Some(Part::S8));
        assert_eq!(args.sizes.s8_rounds, 2);
        assert_eq!(args.sizes.s4_secrets, [20000]);
        assert!(args.sizes.s6_paged);
        let args =
            Args::try_parse_from(["load", "--s4-secrets", "100,200", "--s6-paged", "0"]).unwrap();
        assert_eq!(args.sizes.s4_secrets, [100, 200]);
        assert!(!args.sizes.s6_paged);
        assert!(Args::try_parse_from(["load", "--only", "s4"]).is_err());
        assert!(Args::try_parse_from(["load", "--s8-rounds", "three"]).is_err());
        assert!(Args::try_parse_from(["load", "--csi-statuses", "0"]).is_err());
        assert!(Args::try_parse_from(["load", "--vs", "/no/such/binary"]).is_err());
        let args =
            Args::try_parse_from(["load", "--only", "s10", "--s10-workloads", "500,1000"]).unwrap();
        assert_eq!(args.only, Some(Part::S10));
        assert_eq!(args.sizes.s10_workloads, [500, 1000]);
        assert_eq!(args.sizes.s10_namespaces, 1000);
        assert!(Args::try_parse_from(["load", "--s10-namespaces", "2"]).is_err());
        assert!(Args::try_parse_from(["load", "--s10-changes", "0"]).is_err());
        assert_eq!(args.sizes.s10_rounds, 1);
        assert!(Args::try_parse_from(["load", "--s10-rounds", "0"]).is_err());
        assert!(Args::try_parse_from(["load", "--s10-reloader", "/no/such/binary"]).is_err());
        assert_eq!(
            args.sizes.s10_controllers,
            [S10Controller::Rekindle, S10Controller::Reloader]
        );
        let alone = Args::try_parse_from(["load", "--s10-controllers", "rekindle"]).unwrap();
        assert_eq!(alone.sizes.s10_controllers, [S10Controller::Rekindle]);
        assert!(Args::try_parse_from(["load", "--s10-controllers", "flux"]).is_err());
    }
}
