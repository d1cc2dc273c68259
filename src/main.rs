use std::process::ExitCode;

use clap::Parser;
use rekindle::config::{Cli, Command, Config};

fn config_or_exit(args: &rekindle::config::ServerArgs) -> Result<Config, ExitCode> {
    match Config::from_args(args, |k| std::env::var(k).ok()) {
        Ok((config, warnings)) => {
            for w in warnings {
                eprintln!("WARNING: {w}");
            }
            Ok(config)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Err(ExitCode::from(2))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Hash(args)) => rekindle::tools::run_hash(&args.file, args.output),
        Some(Command::Explain(args)) => {
            let config = match config_or_exit(&args.server) {
                Ok(c) => c,
                Err(code) => return code,
            };
            rekindle::tools::run_explain(
                &config.plan,
                config.release.reload_window.as_ref(),
                &args.workload,
                &args.changed,
                args.event,
                args.output,
            )
        }
        Some(Command::Why(args)) => {
            let config = match config_or_exit(&args.server) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let args = *args;
            rekindle::tools::why::run_why(
                &config,
                rekindle::tools::why::WhyRequest {
                    target: args.target,
                    namespace: args.namespace,
                    all_namespaces: args.all_namespaces,
                    output: args.output,
                },
            )
        }
        Some(Command::MigrateValues(args)) => {
            rekindle::tools::migrate::run(&args.file, args.namespace.as_deref())
        }
        Some(Command::Healthcheck(args)) => rekindle::tools::run_healthcheck(
            &args.urls,
            std::time::Duration::from_secs(args.timeout_seconds),
        ),
        None => {
            let config = match config_or_exit(&cli.server) {
                Ok(c) => c,
                Err(code) => return code,
            };
            rekindle::app::main(config)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
