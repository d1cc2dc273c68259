//! Wiring only: `run` builds the registry, the index and the queue, and starts each part from its own
//! file: the clients (`clients`), the admission webhook (`webhook`), the watch set (`watches`), the
//! write side (`reloads`), the catch-up and consistency pass (`housekeeping`), and the supervisor that
//! watches them all and stops them in order (`supervisor`).

mod clients;
mod housekeeping;
mod reloads;
mod sizes;
mod supervisor;
mod watches;
mod webhook;

use clients::{clients, streaming_lists};
use housekeeping::Housekeeping;
use reloads::{leadership, reload_queue, start_reloads, writer_live_check};
use std::sync::Arc;
use supervisor::{until_stopped, Beside, Critical};
use watches::spawn_watches;
use webhook::start_webhook;

use anyhow::{Context, Result};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::config::scope::ScopeFilter;
use crate::config::{Config, LogFormat};
use crate::core::WorkloadKind;
use crate::index::Index;
use crate::metrics::Metrics;
use crate::outbound::notify::Notifier;
use crate::reload::catch_up::CatchUp;
use crate::reload::lease::Leadership;
use crate::reload::queue::Queue;
use crate::reload::rollouts::Rollouts;
use crate::reload::triggers::Triggers;
use crate::server::admin::{self, Health};
use crate::server::bind;
use crate::watch::{Ctx, ReadyTracker, Sink};

pub fn main(config: Config) -> Result<()> {
    init_logging(&config);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run(config))
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("REKINDLE_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "{},kube=warn,hyper=warn,rustls=warn",
            config.log_level
        ))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match config.log_format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

async fn run(config: Config) -> Result<()> {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(
        &mut registry,
        config.metrics_count_by_namespace,
    ));
    let (client, write_client) = clients(&config, &metrics).await?;
    let shutdown = CancellationToken::new();
    let health = Arc::new(Health::default());
    let index = Arc::new(Index::new());
    let scope = Arc::new(
        ScopeFilter::new(&config.scope)
            .ignoring_kinds(config.plan.policy.ignored_workload_types.iter().copied()),
    );
    let queue = reload_queue(&config, &metrics);
    // Cancelled once the writer has returned: only then may a leader release its Lease.
    let writes_done = CancellationToken::new();
    let (leadership, election) = leadership(&config, &client, &metrics, &shutdown, &writes_done);
    registry.register_collector(Box::new(sizes::SizesCollector {
        index: index.clone(),
        queue: queue.clone(),
        leadership: leadership.clone(),
    }));
    let registry = Arc::new(registry);
    let ready = ReadyTracker::new({
        let health = health.clone();
        move || health.set_ready(true)
    });
    let (builtin, optional) = workload_kinds(&config);

    // Admin server first, so probes answer (503) while the watches sync.
    let live = writer_live_check(queue.clone(), leadership.clone());
    let admin_task = serve_admin(&config, health.clone(), registry, live, &shutdown).await?;
    let mut beside = Beside::default();

    let rollouts = Rollouts::new(
        config.release.max_rollouts_in_progress,
        config.release.rollout_timeout,
        config.release.halt_on_failed_rollout,
        scope.clone(),
        metrics.clone(),
    );
    let sink = sink(
        &config,
        &index,
        &queue,
        &scope,
        &metrics,
        rollouts,
        &mut beside,
    )?;
    let catch_up = sink
        .triggers()
        .map(|triggers| CatchUp::new(index.clone(), triggers.clone(), leadership.clone()));
    let ctx = Arc::new(Ctx {
        plan: config.plan.clone(),
        index: index.clone(),
        sink,
        metrics: metrics.clone(),
        scope: scope.clone(),
        ready: ready.clone(),
        streaming_lists: streaming_lists(&client, config.streaming_lists).await,
        catch_up,
    });
    let kinds = builtin.iter().chain(optional.iter()).copied().collect();
    let webhook_task = start_webhook(
        &config,
        &client,
        &health,
        &ctx,
        kinds,
        &shutdown,
        &mut beside,
    )
    .await?;
    let watches = spawn_watches(&client, &config, &ctx, &builtin, &optional);
    // Every start-up watch is registered: only now may the last one to sync make the process ready.
    ready.seal();
    let writer_task = start_reloads(
        &config,
        &write_client,
        &ctx,
        &leadership,
        &health,
        &shutdown,
        &mut beside,
    )?;
    let housekeeping = housekeeping(&config, &ctx, &leadership);
    let housekeeping = tokio::spawn(housekeeping.run(shutdown.clone()));

    let tasks = Critical {
        writer: writer_task,
        beside,
        election,
        webhook: webhook_task,
        admin: Some(admin_task),
        housekeeping: Some(housekeeping),
        watches,
    };
    until_stopped(tasks, &config, &health, &metrics, &shutdown, &writes_done).await
}

/// What a change leads to, decided once: reloads (stamps, catch-up, queue and writer), or with
/// --webhook-url notifications only. Everything else follows the sink.
fn sink(
    config: &Config,
    index: &Arc<Index>,
    queue: &Arc<Queue>,
    scope: &Arc<ScopeFilter>,
    metrics: &Arc<Metrics>,
    rollouts: Arc<Rollouts>,
    beside: &mut Beside,
) -> Result<Sink> {
    Ok(match &config.webhook_url {
        Some(url) => {
            let (notifier, sender) = Notifier::new(url, metrics.clone())?;
            beside.add("the --webhook-url sender", sender);
            Sink::Notify(notifier)
        }
        None => Sink::Reload {
            triggers: Triggers::new(index.clone(), queue.clone(), scope.clone(), metrics.clone()),
            rollouts,
        },
    })
}

/// The catch-up as the first sync proceeds, then the periodic consistency pass.
fn housekeeping(config: &Config, ctx: &Ctx, leadership: &Leadership) -> Housekeeping {
    Housekeeping {
        index: ctx.index.clone(),
        catch_up: ctx.catch_up.clone(),
        triggers: ctx.sink.triggers().cloned(),
        metrics: ctx.metrics.clone(),
        ready: ctx.ready.clone(),
        leadership: leadership.clone(),
        consistency_interval: config.consistency_interval,
        replay_creates: config.sync_after_restart && config.plan.reload_on_create,
    }
}

/// The workload kinds to watch: built-in kinds are always served; Argo Rollouts (when enabled) and
/// DeploymentConfigs are optional APIs whose watches start when the API appears.
fn workload_kinds(config: &Config) -> (Vec<WorkloadKind>, Vec<WorkloadKind>) {
    let ignored = &config.plan.policy.ignored_workload_types;
    let builtin = [
        WorkloadKind::Deployment,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
        WorkloadKind::CronJob,
        WorkloadKind::Job,
    ]
    .into_iter()
    .filter(|k| !ignored.contains(k))
    .collect();
    let mut optional = vec![WorkloadKind::DeploymentConfig];
    if config.argo_rollouts {
        optional.push(WorkloadKind::Rollout);
    }
    (builtin, optional)
}

async fn serve_admin(
    config: &Config,
    health: Arc<Health>,
    registry: Arc<Registry>,
    live: admin::LiveCheck,
    shutdown: &CancellationToken,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = bind(config.admin_addr)
        .await
        .with_context(|| format!("binding --admin-addr {}", config.admin_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "admin server listening");
    let router = admin::router(health, registry, live);
    let shutdown = shutdown.clone();
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
    }))
}
