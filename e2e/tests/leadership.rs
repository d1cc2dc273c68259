//! One writer whatever the network or the clocks do: two replicas with `--enable-ha`, one of them
//! reaching the apiserver through a proxy the test freezes (a partition: nothing answered, nothing
//! refused), and a Lease rewritten by a third party with timestamps from another clock.

use std::time::Duration;

use anyhow::Result;
use e2e::fixtures::{deployment, env_value, generation};
use e2e::proxy::{in_front_of, FreezableProxy};
use e2e::rekindle::{default_kubeconfig, Options, Rekindle};
use e2e::{admin_client, apply_value, apply_yaml, dynamic_api, get_json, wait_for};
use e2e::{TestNamespace, TIMEOUT};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

const CM: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app-config}\ndata: {greeting: hello}\n";
const LEASE: &str = "rekindle-leader";
const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY_PERIOD: Duration = Duration::from_millis(250);
/// How often the test reads both replicas' `rekindle_leader`.
const POLL: Duration = Duration::from_millis(50);

fn ha_args() -> [String; 4] {
    [
        "--enable-ha".into(),
        format!(
            "--leader-election-lease-duration={}s",
            LEASE_DURATION.as_secs()
        ),
        format!(
            "--leader-election-renew-deadline={}s",
            RENEW_DEADLINE.as_secs()
        ),
        format!(
            "--leader-election-retry-period={}ms",
            RETRY_PERIOD.as_millis()
        ),
    ]
}

async fn change_cm(client: &Client, ns: &str, value: &str) -> Result<()> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"greeting": value}})),
        )
        .await?;
    Ok(())
}

/// Waits until `replica` has counted `n` successful reloads: the count follows the write (after its
/// Event), so a test that saw the write may read it a moment early.
async fn counted(replica: &Rekindle, name: &str, n: f64) -> Result<()> {
    wait_for(&format!("{name} to count {n} reloads"), TIMEOUT, || async {
        Ok((replica.reloads(true).await? == n).then_some(()))
    })
    .await
}

/// Where the replicas keep their Lease: the test's namespace, or the chart's under its RBAC.
fn lease_namespace(ns: &str) -> String {
    std::env::var("REKINDLE_E2E_POD_NAMESPACE").unwrap_or_else(|_| ns.to_string())
}

/// Starts replica `name` (its identity, its Lease namespace), optionally through another kubeconfig.
async fn replica(
    client: &Client,
    ns: &str,
    name: &str,
    kubeconfig: Option<std::path::PathBuf>,
) -> Result<Rekindle> {
    let args = ha_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Rekindle::start(
        client,
        &[ns],
        Options {
            args: &args,
            env: &[("POD_NAMESPACE", &lease_namespace(ns)), ("POD_NAME", name)],
            instance: name,
            kubeconfig,
            ..Default::default()
        },
    )
    .await
}

/// Replica A, reaching the apiserver through a proxy the test can freeze, holding the Lease, and
/// replica B beside it.
async fn two_replicas(client: &Client, ns: &str) -> Result<(FreezableProxy, Rekindle, Rekindle)> {
    let (proxy, through_proxy) = in_front_of(
        &default_kubeconfig(),
        &format!("{ns}-through-proxy.kubeconfig"),
    )
    .await?;
    let a = replica(client, ns, "replica-a", Some(through_proxy)).await?;
    wait_holder(client, ns, "replica-a").await?;
    let b = replica(client, ns, "replica-b", None).await?;
    Ok((proxy, a, b))
}

fn leases(client: &Client, ns: &str) -> Api<Lease> {
    Api::namespaced(client.clone(), &lease_namespace(ns))
}

async fn wait_holder(client: &Client, ns: &str, holder: &str) -> Result<()> {
    let leases = leases(client, ns);
    wait_for(&format!("{holder} to hold the Lease"), TIMEOUT, || async {
        Ok(leases
            .get_opt(LEASE)
            .await?
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| h == holder)
            .map(|_| ()))
    })
    .await
}

/// Both replicas' `rekindle_leader`, read every [`POLL`] for `span`: when each reading was taken and
/// what the two said.
struct Readings(Vec<(Duration, bool, bool)>);

impl Readings {
    async fn take(a: &Rekindle, b: &Rekindle, from: Instant, span: Duration) -> Result<Self> {
        let mut readings = Vec::new();
        while from.elapsed() < span {
            let at = from.elapsed();
            let a_leads = a.metric("rekindle_leader").await? == 1.0;
            let b_leads = b.metric("rekindle_leader").await? == 1.0;
            readings.push((at, a_leads, b_leads));
            tokio::time::sleep(POLL).await;
        }
        Ok(Self(readings))
    }

    /// When A first said it does not lead.
    fn a_stopped(&self) -> Option<Duration> {
        self.0.iter().find(|r| !r.1).map(|r| r.0)
    }

    /// When B first said it leads.
    fn b_started(&self) -> Option<Duration> {
        self.0.iter().find(|r| r.2).map(|r| r.0)
    }

    /// How long both said they lead: the readings where both did, each standing for the time to the next.
    fn both_led(&self) -> Duration {
        self.0
            .windows(2)
            .filter(|w| w[0].1 && w[0].2)
            .map(|w| w[1].0 - w[0].0)
            .sum()
    }
}

/// The leader's connection to the apiserver freezes: it stops leading within renew deadline + retry
/// period, the other replica leads within lease duration + 3 retry periods, never both at once; a
/// change made meanwhile rolls its Deployment once and re-creates its Job once; after the path heals,
/// the old leader writes nothing.
#[tokio::test]
async fn a_leader_cut_off_from_the_apiserver_stops_before_another_leads() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-freeze").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let (proxy, a, b) = two_replicas(&client, &ns.name).await?;

    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    apply_value(
        &client,
        Some(&ns.name),
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "migrate", "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox",
                "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}}}}),
    )
    .await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let jobs = Api::<Job>::namespaced(client.clone(), &ns.name);
    // A first change, written by A: both replicas know both workloads.
    let job_uid = jobs.get("migrate").await?.uid();
    change_cm(&client, &ns.name, "one").await?;
    let job_uid = wait_for("A to re-create the Job", TIMEOUT, || async {
        Ok(jobs
            .get_opt("migrate")
            .await?
            .map(|j| j.uid())
            .filter(|u| *u != job_uid))
    })
    .await?;
    wait_for("A to roll web", TIMEOUT, || async {
        Ok((generation(&get_json(&deployments, "web").await?) == 2).then_some(()))
    })
    .await?;
    counted(&a, "A", 2.0).await?;
    assert_eq!(b.reloads(true).await?, 0.0, "B wrote nothing");

    // The partition, and a change made during it.
    let a_wrote = a.reloads(true).await?;
    let frozen_at = Instant::now();
    proxy.freeze();
    change_cm(&client, &ns.name, "two").await?;
    let span = LEASE_DURATION + 4 * RETRY_PERIOD + Duration::from_secs(2);
    let readings = Readings::take(&a, &b, frozen_at, span).await?;
    let a_stopped = readings.a_stopped().expect("A never stopped leading");
    let b_started = readings.b_started().expect("B never led");
    println!(
        "A stopped leading {a_stopped:?} after the freeze, B led {b_started:?} after it, both said they led for {:?}",
        readings.both_led()
    );
    assert!(
        a_stopped <= RENEW_DEADLINE + RETRY_PERIOD + POLL,
        "A led {a_stopped:?} into the partition"
    );
    assert!(
        b_started <= LEASE_DURATION + 3 * RETRY_PERIOD + POLL,
        "B took over only {b_started:?} after the freeze"
    );
    assert_eq!(readings.both_led(), Duration::ZERO, "two leaders at once");
    assert!(
        a.metric("rekindle_errors_total{kind=\"lease\"}").await? >= 1.0,
        "A's renewals that timed out are counted"
    );

    let job_uid_after = wait_for("B to re-create the Job", TIMEOUT, || async {
        Ok(jobs
            .get_opt("migrate")
            .await?
            .map(|j| j.uid())
            .filter(|u| *u != job_uid))
    })
    .await?;
    wait_for("B to roll web", TIMEOUT, || async {
        Ok((generation(&get_json(&deployments, "web").await?) >= 3).then_some(()))
    })
    .await?;

    // The path heals: A's held requests land, it re-joins as a follower and writes nothing.
    proxy.heal();
    tokio::time::sleep(LEASE_DURATION * 3).await;
    assert_eq!(
        generation(&get_json(&deployments, "web").await?),
        3,
        "web rolled once for the change made during the partition"
    );
    let uids: Vec<_> = jobs
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|j| j.uid())
        .collect();
    assert_eq!(uids, [job_uid_after], "the Job re-created once");
    assert_eq!(
        a.reloads(true).await?,
        a_wrote,
        "A wrote after losing the Lease"
    );
    assert_eq!(b.reloads(true).await?, 2.0, "B wrote the change once");
    assert_eq!(a.metric("rekindle_leader").await?, 0.0);
    assert_eq!(b.metric("rekindle_leader").await?, 1.0);
    b.stop().await?;
    a.stop().await?;
    ns.cleanup().await
}

/// The marker rekindle keeps on web for app-config.
fn marker(web: &serde_json::Value) -> Option<String> {
    env_value(web, "STAKATER_APP_CONFIG_CONFIGMAP")
}

/// The leader sends a reload just as its requests stop arriving (it still sees the change, nothing it
/// sends gets through). The other replica takes over and reloads that change and a newer one; when the
/// path heals, the old leader's held PATCH reaches the apiserver after both: it is refused, so the
/// workload keeps the newest markers and rolled exactly once per change.
#[tokio::test]
async fn a_write_held_by_a_partition_never_lands_over_a_newer_leaders() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-held").await?;
    apply_yaml(&client, Some(&ns.name), CM).await?;
    let (proxy, a, b) = two_replicas(&client, &ns.name).await?;
    deployment("web")
        .auto()
        .uses_configmap("app-config")
        .apply(&client, &ns.name)
        .await?;
    let deployments = dynamic_api(&client, "apps/v1", "Deployment", Some(&ns.name)).await?;
    let rolled_to = |n: u64| {
        let deployments = deployments.clone();
        async move {
            wait_for(&format!("web at generation {n}"), TIMEOUT, || async {
                let web = get_json(&deployments, "web").await?;
                Ok((generation(&web) == n).then_some(web))
            })
            .await
        }
    };
    change_cm(&client, &ns.name, "one").await?;
    rolled_to(2).await?;
    counted(&a, "A", 1.0).await?;

    // A's requests are held from here on; it still sees "two" and sends its reload of it.
    proxy.freeze_requests();
    change_cm(&client, &ns.name, "two").await?;
    wait_holder(&client, &ns.name, "replica-b").await?;
    let two = marker(&rolled_to(3).await?);
    change_cm(&client, &ns.name, "three").await?;
    let three = marker(&rolled_to(4).await?);
    assert_ne!(two, three);

    proxy.heal();
    let conflict = "rekindle_reload_attempt_failures_total{reason=\"conflict\"}";
    wait_for("A's held PATCH to be answered", TIMEOUT, || async {
        let answered = a.metric(conflict).await? >= 1.0 || a.reloads(true).await? > 1.0;
        Ok(answered.then_some(()))
    })
    .await?;
    tokio::time::sleep(LEASE_DURATION * 3).await;
    let web = get_json(&deployments, "web").await?;
    assert_eq!(
        generation(&web),
        4,
        "one rollout per change, none from the held write"
    );
    assert_eq!(marker(&web), three, "the newest markers stay");
    assert_eq!(a.reloads(true).await?, 1.0, "the held write did not land");
    // At least this one (a write right after web was created may also have met the controller's
    // status update and been retried).
    assert!(
        a.metric(conflict).await? >= 1.0,
        "the held write was refused"
    );
    assert_eq!(
        b.reloads(true).await?,
        2.0,
        "B wrote two and three once each"
    );
    b.stop().await?;
    a.stop().await?;
    ns.cleanup().await
}

/// Lease timestamps come from other clocks and never decide expiry: a `renewTime` a day old written by
/// a third party over a live Lease does not let the follower take it, and a `renewTime` a day ahead over
/// a Lease whose holder froze does not keep the follower out once the record has not changed for the
/// lease duration on its own clock.
#[tokio::test]
async fn lease_timestamps_from_other_clocks_never_make_two_leaders() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-clock").await?;
    let (proxy, a, b) = two_replicas(&client, &ns.name).await?;
    let leases = leases(&client, &ns.name);
    let stamp = |offset: jiff::SignedDuration| {
        (jiff::Timestamp::now() + offset)
            .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
            .to_string()
    };
    let write_renew_time = move |at: String| {
        let leases = leases.clone();
        async move {
            leases
                .patch(
                    LEASE,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"renewTime": at}})),
                )
                .await
        }
    };

    // A day in the past, over and over, while A renews: B never leads.
    let from = Instant::now();
    let past = tokio::spawn({
        let write = write_renew_time.clone();
        async move {
            for _ in 0..20 {
                let _ = write(stamp(jiff::SignedDuration::from_hours(-24))).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    });
    let readings = Readings::take(&a, &b, from, LEASE_DURATION * 2).await?;
    past.await?;
    assert_eq!(
        readings.b_started(),
        None,
        "B took a live Lease that looked old"
    );
    assert_eq!(
        readings.a_stopped(),
        None,
        "A stopped leading while renewing"
    );

    // A freezes; a renewTime a day ahead is written once: B still takes over in time.
    proxy.freeze();
    let frozen_at = Instant::now();
    write_renew_time(stamp(jiff::SignedDuration::from_hours(24))).await?;
    let readings = Readings::take(
        &a,
        &b,
        frozen_at,
        LEASE_DURATION + 4 * RETRY_PERIOD + Duration::from_secs(2),
    )
    .await?;
    let b_started = readings
        .b_started()
        .expect("B never took a Lease whose holder froze");
    assert!(
        b_started <= LEASE_DURATION + 3 * RETRY_PERIOD + POLL * 2,
        "B took over {b_started:?} after the freeze"
    );
    assert_eq!(readings.both_led(), Duration::ZERO, "two leaders at once");
    proxy.heal();
    b.stop().await?;
    a.stop().await?;
    ns.cleanup().await
}
