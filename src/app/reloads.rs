//! The write side: the reload queue, the leader election, the writer and what runs beside it.

use std::sync::Arc;

use super::clients::instance_name;
use super::supervisor::Beside;
use anyhow::Result;
use kube::runtime::events::{Recorder, Reporter};
use kube::Client;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::outbound::alert::Alerter;
use crate::reload::lease::{self, Leadership};
use crate::reload::queue::{Queue, QueueConfig};
use crate::reload::recreate::Records;
use crate::reload::rollouts::Rollouts;
use crate::reload::warm;
use crate::reload::writer::{self, Writer, WriterParts};
use crate::server::admin::{self, Health};
use crate::watch::{Ctx, Sink};

/// The writer and what runs beside it, when changes are reloaded (not with `--webhook-url`).
pub(super) fn start_reloads(
    config: &Config,
    write_client: &Client,
    ctx: &Ctx,
    leadership: &Leadership,
    health: &Arc<Health>,
    shutdown: &CancellationToken,
    beside: &mut Beside,
) -> Result<Option<JoinHandle<()>>> {
    let Sink::Reload { triggers, rollouts } = &ctx.sink else {
        tracing::info!("--webhook-url: changes are POSTed there; no workload is touched");
        return Ok(None);
    };
    let writer = writer(
        config,
        write_client,
        ctx,
        triggers.queue(),
        leadership,
        rollouts.clone(),
        beside,
    )?;
    Ok(Some(start_writer(
        writer,
        write_client,
        health,
        shutdown,
        beside,
    )))
}

/// The reload queue of the configuration's debounce and cooldown.
pub(super) fn reload_queue(config: &Config, metrics: &Metrics) -> Arc<Queue> {
    let queue = Queue::new(QueueConfig {
        debounce: config.pacing.reload_debounce,
        debounce_max: config.pacing.reload_debounce_max,
        min_interval: config.pacing.min_reload_interval,
    });
    Arc::new(queue.counting_adds(metrics.workqueue_adds.clone()))
}

/// `/live` fails while reloads are owed and the writer has taken and finished nothing for too long.
pub(super) fn writer_live_check(queue: Arc<Queue>, leadership: Leadership) -> admin::LiveCheck {
    Arc::new(move || {
        let stalled = writer::stalled_for(&queue, &leadership);
        (stalled > writer::STALL_LIMIT).then(|| {
            format!(
                "the writer has taken and finished nothing for {}s while reloads are owed",
                stalled.as_secs()
            )
        })
    })
}

/// Starts the writer, with the supervision of its rollouts and the write connection kept warm beside it.
fn start_writer(
    writer: Arc<Writer>,
    write_client: &Client,
    health: &Arc<Health>,
    shutdown: &CancellationToken,
    beside: &mut Beside,
) -> JoinHandle<()> {
    let synced = {
        let health = health.clone();
        move || health.is_ready()
    };
    let supervision = tokio::spawn(writer.clone().supervise_rollouts(synced, shutdown.clone()));
    let warm = tokio::spawn(warm::keep_warm(
        write_client.clone(),
        warm::INTERVAL,
        shutdown.clone(),
    ));
    beside.add("the rollout supervision", supervision);
    beside.add("the writer's warm connection", warm);
    tokio::spawn(writer.run(shutdown.clone()))
}

fn writer(
    config: &Config,
    client: &Client,
    ctx: &Ctx,
    queue: &Arc<Queue>,
    leadership: &Leadership,
    rollouts: Arc<Rollouts>,
    beside: &mut Beside,
) -> Result<Arc<Writer>> {
    let metrics = &ctx.metrics;
    let reporter = Reporter {
        controller: "rekindle".into(),
        instance: instance_name(config),
    };
    let alerter = match config.alerts.clone() {
        Some(alerts) => {
            tracing::info!(sink = ?alerts.sink, "alerts after reloads on");
            let (alerter, sender) = Alerter::start(alerts, metrics.clone())?;
            beside.add("the alert sender", sender);
            Some(alerter)
        }
        None => None,
    };
    let writer = Writer::new(WriterParts {
        client: client.clone(),
        plan: config.plan.clone(),
        index: ctx.index.clone(),
        queue: queue.clone(),
        metrics: metrics.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        max_concurrent: config.pacing.max_concurrent_reloads,
        leadership: leadership.clone(),
        alerter,
        default_window: config.release.reload_window.clone(),
        rollouts,
        sync: Some(ctx.ready.progress()),
        recreates: config
            .pod_namespace
            .as_ref()
            .map(|namespace| Records::new(client.clone(), namespace)),
    });
    Ok(Arc::new(writer))
}

/// With `--enable-ha`, the Lease election; otherwise this replica always writes.
pub(super) fn leadership(
    config: &Config,
    client: &Client,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
    writes_done: &CancellationToken,
) -> (Leadership, Option<tokio::task::JoinHandle<()>>) {
    let election = &config.leader_election;
    if !election.enable_ha {
        return (Leadership::always(), None);
    }
    let identity = instance_name(config).unwrap_or_else(|| "rekindle".into());
    let namespace = config
        .pod_namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    tracing::info!(%identity, %namespace, lease = %election.lease_name, "leader election on");
    let (leadership, election) = lease::start(
        client.clone(),
        lease::LeaseConfig {
            namespace,
            name: election.lease_name.clone(),
            identity,
            lease_duration: election.lease_duration,
            renew_deadline: election.renew_deadline,
            retry_period: election.retry_period,
        },
        metrics.clone(),
        shutdown.clone(),
        writes_done.clone(),
    );
    (leadership, Some(election))
}
