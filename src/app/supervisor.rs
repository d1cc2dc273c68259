//! The supervisor: the tasks a replica needs, watched together; the first that ends (returns or
//! panics) stops the others in order and ends the process, named, so the replica is restarted.

use anyhow::Result;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::server::admin::Health;

/// How long a replica whose task failed may take to stop its other tasks and release its Lease.
const STOP_AFTER_FAILURE: std::time::Duration = std::time::Duration::from_secs(10);

/// The tasks without which the replica does not do its job. None ends before shutdown: the first that
/// does (returns or panics) ends the process.
pub(super) struct Critical {
    pub(super) writer: Option<JoinHandle<()>>,
    pub(super) election: Option<JoinHandle<()>>,
    pub(super) webhook: Option<JoinHandle<()>>,
    pub(super) admin: Option<JoinHandle<()>>,
    pub(super) housekeeping: Option<JoinHandle<()>>,
    /// The tasks that serve these, each by its name.
    pub(super) beside: Beside,
    /// Each watch by its name (`configmaps/<namespace>`, `Deployment/*`, ...).
    pub(super) watches: Vec<(String, Option<JoinHandle<()>>)>,
}

/// The tasks that serve a critical one (the rollout supervision, the writer's warm connection, the
/// certificate refresh, the `--webhook-url` and alert senders), each by its name: as critical as what
/// they serve, since without them it goes on silently doing less.
#[derive(Default)]
pub(super) struct Beside(Vec<(String, Option<JoinHandle<()>>)>);

impl Beside {
    pub(super) fn add(&mut self, name: &str, task: JoinHandle<()>) {
        self.0.push((name.into(), Some(task)));
    }
}

impl Critical {
    fn slots(&mut self) -> Vec<(String, &mut Option<JoinHandle<()>>)> {
        let mut slots = vec![
            ("the writer".to_string(), &mut self.writer),
            ("the leader election".to_string(), &mut self.election),
            (
                "the admission webhook server".to_string(),
                &mut self.webhook,
            ),
            ("the admin server".to_string(), &mut self.admin),
            (
                "the catch-up and consistency pass".to_string(),
                &mut self.housekeeping,
            ),
        ];
        for (name, task) in &mut self.beside.0 {
            slots.push((name.clone(), task));
        }
        for (name, task) in &mut self.watches {
            slots.push((format!("the watch of {name}"), task));
        }
        slots
    }

    /// Waits for the first task to end; its name and how it ended. It is taken out, so
    /// [`Critical::stop`] does not wait for it again.
    async fn first_to_end(&mut self) -> (String, String) {
        first_to_end(self.slots()).await
    }

    /// Stops everything in order: the writer's last write returns before the Lease is released, so two
    /// replicas never write at once; the webhook drains; the watches and housekeeping are dropped.
    async fn stop(mut self, shutdown: &CancellationToken, writes_done: &CancellationToken) {
        shutdown.cancel();
        if let Some(t) = self.writer.take() {
            let _ = t.await;
        }
        writes_done.cancel();
        for (_, t) in &mut self.beside.0 {
            if let Some(t) = t.take() {
                t.abort();
            }
        }
        if let Some(t) = self.election.take() {
            let _ = t.await;
        }
        if let Some(t) = self.webhook.take() {
            let _ = t.await;
        }
        for (_, w) in &mut self.watches {
            if let Some(w) = w.take() {
                w.abort();
            }
        }
        if let Some(t) = self.housekeeping.take() {
            t.abort();
        }
        if let Some(t) = self.admin.take() {
            let _ = t.await;
        }
    }
}

/// Waits for the first of `tasks` (those present) to end, takes it out of its slot, and says which one
/// it was and how it ended (returned, or panicked).
async fn first_to_end(tasks: Vec<(String, &mut Option<JoinHandle<()>>)>) -> (String, String) {
    let (names, slots): (Vec<String>, Vec<_>) = tasks.into_iter().unzip();
    let running: Vec<_> = slots
        .into_iter()
        .enumerate()
        .filter(|(_, slot)| slot.is_some())
        .map(|(i, slot)| {
            Box::pin(async move {
                let result = match slot.as_mut() {
                    Some(task) => task.await,
                    None => std::future::pending().await,
                };
                (i, result, slot)
            })
        })
        .collect();
    if running.is_empty() {
        return std::future::pending().await;
    }
    let ((i, result, slot), _, _) = futures::future::select_all(running).await;
    *slot = None;
    let how = match result {
        Ok(()) => "returned".to_string(),
        Err(e) if e.is_panic() => "panicked".to_string(),
        Err(e) => e.to_string(),
    };
    (names[i].clone(), how)
}

/// Runs until a signal, or until one of the critical tasks ends (an error: the replica is restarted);
/// then stops them all in order.
pub(super) async fn until_stopped(
    mut tasks: Critical,
    config: &Config,
    health: &Health,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    writes_done: &CancellationToken,
) -> Result<()> {
    let ended = tokio::select! {
        _ = wait_for_signal() => None,
        ended = tasks.first_to_end() => Some(ended),
    };
    if let Some((task, how)) = ended {
        // Live and Ready but silently not doing its job is worse than a restart: the catch-up of the
        // next start repairs whatever this replica left undone. The Lease is still released, so the
        // other replica need not wait for it to expire.
        tracing::error!(%task, %how, "a task the replica needs stopped; exiting");
        health.set_ready(false);
        metrics.ready.set(0);
        let stopped = tasks.stop(shutdown, writes_done);
        if tokio::time::timeout(STOP_AFTER_FAILURE, stopped)
            .await
            .is_err()
        {
            tracing::warn!("could not stop cleanly within {STOP_AFTER_FAILURE:?}");
        }
        anyhow::bail!("{task} stopped ({how}); exiting so the replica is restarted");
    }
    tracing::info!("shutting down: failing readiness, draining");
    health.set_ready(false);
    metrics.ready.set(0);
    if tasks.webhook.is_some() && !config.shutdown_delay.is_zero() {
        // Endpoints drop an unready Pod a few seconds late; keep answering the apiserver until then.
        tokio::time::sleep(config.shutdown_delay).await;
    }
    tasks.stop(shutdown, writes_done).await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn critical(writer: JoinHandle<()>, watches: Vec<(&str, JoinHandle<()>)>) -> Critical {
        Critical {
            writer: Some(writer),
            election: None,
            webhook: None,
            admin: None,
            housekeeping: None,
            beside: Beside::default(),
            watches: watches
                .into_iter()
                .map(|(n, t)| (n.to_string(), Some(t)))
                .collect(),
        }
    }

    /// Any critical task that ends, a watch included, is named with how it ended and taken out; stopping
    /// the rest then neither waits for it again nor hangs.
    #[tokio::test]
    async fn a_critical_task_that_panics_or_returns_is_named() {
        let forever = || tokio::spawn(std::future::pending::<()>());
        let mut tasks = critical(
            forever(),
            vec![
                ("configmaps/a", forever()),
                ("Deployment/a", tokio::spawn(async { panic!("boom") })),
            ],
        );
        let ended = tasks.first_to_end().await;
        assert_eq!(
            ended,
            ("the watch of Deployment/a".into(), "panicked".into())
        );
        assert!(tasks.watches[1].1.is_none(), "the ended task was taken out");

        let mut tasks = critical(forever(), vec![("secrets/*", tokio::spawn(async {}))]);
        let ended = tasks.first_to_end().await;
        assert_eq!(ended, ("the watch of secrets/*".into(), "returned".into()));
        // The writer is still running: stop() cancels it through `shutdown`, so give it one that listens.
        let shutdown = CancellationToken::new();
        tasks.writer = Some(tokio::spawn(shutdown.clone().cancelled_owned()));
        let writes_done = CancellationToken::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tasks.stop(&shutdown, &writes_done),
        )
        .await
        .expect("stopping the rest after a failure hangs");
        assert!(writes_done.is_cancelled());

        let mut writer_returns = critical(tokio::spawn(async {}), vec![]);
        assert_eq!(
            writer_returns.first_to_end().await,
            ("the writer".into(), "returned".into())
        );

        // The tasks beside the writer are supervised too: the rollout supervision writes no halt and
        // wakes no deferred reload once it is gone.
        let mut beside = critical(forever(), vec![]);
        beside.beside.add(
            "the rollout supervision",
            tokio::spawn(async { panic!("boom") }),
        );
        assert_eq!(
            beside.first_to_end().await,
            ("the rollout supervision".into(), "panicked".into())
        );
    }
}
