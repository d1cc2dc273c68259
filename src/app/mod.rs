//! Wiring only: the client, the registry, the index, the servers, the watches and the writer.

mod clients;
mod housekeeping;
mod sizes;
mod supervisor;

use clients::{clients, instance_name, self_username, streaming_lists};
use housekeeping::Housekeeping;
use std::sync::Arc;
use supervisor::{until_stopped, Beside, Critical};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admission::{self, http as admission_http, Admission};
use crate::config::scope::ScopeFilter;
use crate::config::{Config, LogFormat};
use crate::core::{ResourceKind, WorkloadKind};
use crate::index::Index;
use crate::metrics::Metrics;
use crate::outbound::alert::Alerter;
use crate::outbound::notify::Notifier;
use crate::reload::catch_up::CatchUp;
use crate::reload::lease::{self, Leadership};
use crate::reload::queue::{Queue, QueueConfig};
use crate::reload::recreate::Records;
use crate::reload::rollouts::Rollouts;
use crate::reload::triggers::Triggers;
use crate::reload::warm;
use crate::reload::writer::{self, Writer, WriterParts};
use crate::server::admin::{self, Health};
use crate::server::{bind, tls};
use crate::watch::{self, Ctx, ReadyTracker, Sink, WatchId, WatchPart, Watched};

/// ConfigMaps and Secrets per list page at start-up and re-list.
const RESOURCE_LIST_PAGE: u32 = 100;

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
    let (leadership, election) = leadership(&config, &client, &shutdown, &writes_done);
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

/// The admission webhook, when TLS is configured: stamps what the index knows, and (with
/// `--admission-lookup`) reads what it misses.
async fn start_webhook(
    config: &Config,
    client: &Client,
    health: &Arc<Health>,
    ctx: &Ctx,
    kinds: Vec<WorkloadKind>,
    shutdown: &CancellationToken,
    beside: &mut Beside,
) -> Result<Option<JoinHandle<()>>> {
    let metrics = &ctx.metrics;
    let admission = Admission {
        plan: config.plan.clone(),
        scope: ctx.scope.clone(),
        index: ctx.index.clone(),
        metrics: metrics.clone(),
        self_username: self_username(client).await,
        notify_only: ctx.sink.triggers().is_none(),
        kinds,
        lookup: config
            .admission_lookup
            .then(|| admission_lookup(config, client, health, metrics)),
    };
    serve_webhook(config, Arc::new(admission), metrics, shutdown, beside).await
}

/// The writer and what runs beside it, when changes are reloaded (not with `--webhook-url`).
fn start_reloads(
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

/// The reload queue of the configuration's debounce and cooldown.
fn reload_queue(config: &Config, metrics: &Metrics) -> Arc<Queue> {
    let queue = Queue::new(QueueConfig {
        debounce: config.pacing.reload_debounce,
        debounce_max: config.pacing.reload_debounce_max,
        min_interval: config.pacing.min_reload_interval,
    });
    Arc::new(queue.counting_adds(metrics.workqueue_adds.clone()))
}

/// `/live` fails while reloads are owed and the writer has taken and finished nothing for too long.
fn writer_live_check(queue: Arc<Queue>, leadership: Leadership) -> admin::LiveCheck {
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

/// With `--enable-ha`, the Lease election; otherwise this replica always writes.
fn leadership(
    config: &Config,
    client: &Client,
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
        shutdown.clone(),
        writes_done.clone(),
    );
    (leadership, Some(election))
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

/// `--admission-lookup`: reads at admission what the index does not know yet, of the watched kinds.
fn admission_lookup(
    config: &Config,
    client: &Client,
    health: &Arc<Health>,
    metrics: &Arc<Metrics>,
) -> Arc<admission::lookup::Lookup> {
    let watched = [
        (ResourceKind::ConfigMap, !config.ignore_configmaps),
        (ResourceKind::Secret, !config.ignore_secrets),
    ];
    Arc::new(admission::lookup::Lookup::new(
        client.clone(),
        health.clone(),
        config.plan.policy.keys.clone(),
        config.resource_label_selector.clone(),
        watched
            .iter()
            .filter(|(_, w)| *w)
            .map(|(k, _)| *k)
            .collect(),
        metrics.clone(),
    ))
}

/// The admission webhook over TLS, when a certificate is given.
async fn serve_webhook(
    config: &Config,
    admission: Arc<Admission>,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    beside: &mut Beside,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    let webhook = &config.webhook;
    let (Some(cert), Some(key)) = (&webhook.tls_cert_file, &webhook.tls_key_file) else {
        tracing::warn!("no --tls-cert-file/--tls-key-file: the admission webhook is off; workloads are found by the watch only");
        return Ok(None);
    };
    let certs = tls::ReloadingCert::new(cert, key)?;
    let tls_config = tls::server_config(
        certs.clone(),
        webhook.tls_min_version,
        webhook.webhook_http2,
    )?;
    let listener = bind(webhook.webhook_addr)
        .await
        .with_context(|| format!("binding --webhook-addr {}", webhook.webhook_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "admission webhook listening");
    beside.add(
        "the certificate refresh",
        certs.keep_fresh(metrics.tls_cert_not_after.clone(), shutdown.clone()),
    );
    Ok(Some(tokio::spawn(tls::serve(
        listener,
        tls_config,
        admission_http::router(admission),
        shutdown.clone(),
    ))))
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

/// The watches started so far, each by its name (readiness and supervision know it by the same one).
struct Watches<'a> {
    ready: &'a ReadyTracker,
    started: Vec<(String, Option<JoinHandle<()>>)>,
}

impl Watches<'_> {
    /// Starts `watch`, registered first with readiness when its first sync counts there (so a quick
    /// sync is never missed).
    fn start(
        &mut self,
        id: WatchId,
        part: Option<WatchPart>,
        watch: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let name = id.to_string();
        if let Some(part) = part {
            self.ready.expect(&name, part);
        }
        self.started.push((name, Some(tokio::spawn(watch))));
    }

    /// The watches of one namespace (`None`: cluster-wide): ConfigMaps, Secrets, CSI objects and
    /// workloads.
    fn start_in(
        &mut self,
        client: &Client,
        config: &Config,
        ctx: &Arc<Ctx>,
        ns: Option<&str>,
        builtin: &[WorkloadKind],
        optional: &[WorkloadKind],
    ) {
        // Smaller list pages than kube's 500: a page of large Secrets is held whole while it is hashed, and
        // the allocator keeps that high-water mark as RSS. More list requests at start-up, less memory.
        let label_config = |c: watcher::Config| {
            let c = ctx.list_config(c.page_size(RESOURCE_LIST_PAGE));
            match &config.resource_label_selector {
                Some(sel) => c.labels(&sel.to_string()),
                None => c,
            }
        };
        let in_ns = |watched: Watched| watched.in_namespace(ns);
        if !config.ignore_configmaps {
            let api: Api<ConfigMap> = match ns {
                Some(n) => Api::namespaced(client.clone(), n),
                None => Api::all(client.clone()),
            };
            self.start(
                in_ns(Watched::Resources(ResourceKind::ConfigMap)),
                Some(WatchPart::Resources(ResourceKind::ConfigMap)),
                watch::resources(
                    api,
                    label_config(watcher::Config::default()),
                    ResourceKind::ConfigMap,
                    ns.map(String::from),
                    ctx.clone(),
                ),
            );
        }
        if !config.ignore_secrets {
            // Helm release blobs are large and never mounted: keep them out of the watch.
            let wc = label_config(watcher::Config::default().fields("type!=helm.sh/release.v1"));
            let api: Api<Secret> = match ns {
                Some(n) => Api::namespaced(client.clone(), n),
                None => Api::all(client.clone()),
            };
            self.start(
                in_ns(Watched::Resources(ResourceKind::Secret)),
                Some(WatchPart::Resources(ResourceKind::Secret)),
                watch::resources(
                    api,
                    wc,
                    ResourceKind::Secret,
                    ns.map(String::from),
                    ctx.clone(),
                ),
            );
        }
        if config.enable_csi {
            let labels = config
                .resource_label_selector
                .as_ref()
                .map(|s| s.to_string());
            self.start(
                in_ns(Watched::ClassPodStatuses),
                None,
                watch::spcps(client.clone(), ns.map(String::from), labels, ctx.clone()),
            );
            self.start(
                in_ns(Watched::Classes),
                None,
                watch::spcs(client.clone(), ns.map(String::from), ctx.clone()),
            );
        }
        for kind in optional {
            self.start(
                in_ns(Watched::Workloads(*kind)),
                None,
                watch::optional_workloads(client.clone(), *kind, ns.map(String::from), ctx.clone()),
            );
        }
        for kind in builtin {
            self.start(
                in_ns(Watched::Workloads(*kind)),
                Some(WatchPart::Workloads),
                watch::workloads(client.clone(), *kind, ns.map(String::from), ctx.clone()),
            );
        }
        // Not waited for by readiness: an install whose RBAC predates pod restarts (no `watch` on
        // pods) keeps reloading workloads, with this watch retrying and logging why.
        if ctx.plan.pod_restarts && ctx.sink.triggers().is_some() {
            self.start(
                in_ns(Watched::LabelledPods),
                None,
                watch::pods(client.clone(), ns.map(String::from), ctx.clone()),
            );
        }
    }
}

/// Starts every watch of the configuration (resources per watched namespace, workloads, the namespace
/// selector's Namespaces, CSI), each registered with the readiness tracker first.
fn spawn_watches(
    client: &Client,
    config: &Config,
    ctx: &Arc<Ctx>,
    builtin: &[WorkloadKind],
    optional: &[WorkloadKind],
) -> Vec<(String, Option<JoinHandle<()>>)> {
    let scope = &ctx.scope;
    let namespaces: Vec<Option<String>> = match scope.watched_namespaces() {
        Some(list) => list.iter().cloned().map(Some).collect(),
        None => vec![None],
    };
    let mut watches = Watches {
        ready: &ctx.ready,
        started: Vec::new(),
    };
    // Namespaces: the selector's labels (the scope waits for them) and the default reload windows;
    // one by one in a scoped install, which may read only its own namespaces.
    if scope.watched_namespaces().is_none() {
        let part = scope.selector().is_some().then_some(WatchPart::Scope);
        watches.start(
            Watched::Namespaces.in_namespace(None),
            part,
            watch::namespaces(client.clone(), None, ctx.clone()),
        );
    }
    for ns in namespaces.iter().flatten() {
        watches.start(
            Watched::Namespaces.in_namespace(Some(ns)),
            None,
            watch::namespaces(client.clone(), Some(ns.clone()), ctx.clone()),
        );
    }
    for ns in &namespaces {
        watches.start_in(client, config, ctx, ns.as_deref(), builtin, optional);
    }
    watches.started
}
