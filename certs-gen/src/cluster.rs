//! `certs-gen cluster`: the webhook's TLS Secret, its CA Secret and the caBundle of the
//! MutatingWebhookConfiguration, kept in a cluster without cert-manager.
//!
//! The decision (what to issue) is pure and unit-tested; the cluster part only reads, then writes what
//! the decision says. A valid certificate is never rewritten, so running it on every `helm upgrade`
//! causes no churn.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256,
};
use serde_json::json;
use time::{Duration, OffsetDateTime};

use crate::{base_params, pem_der, sans, still_valid, Want, RENEW_BEFORE};

/// The label on every Secret certs-gen owns; a Secret without it is never touched.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "certs-gen");
const FIELD_MANAGER: &str = "certs-gen";
const CA_DAYS: i64 = 3650;

/// What the TLS Secret and CA Secret hold (PEM text).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Material {
    pub ca_cert: String,
    pub ca_key: String,
    /// The CA bundle clients trust: the current CA, plus the previous one while it is valid (rollover).
    pub bundle: String,
    pub leaf_cert: String,
    pub leaf_key: String,
}

/// The outcome of [`decide`]: the material to publish and which Secrets must be written.
#[derive(Debug)]
pub struct Decision {
    pub material: Material,
    pub write_ca: bool,
    pub write_tls: bool,
    pub reasons: Vec<String>,
}

/// What the CA Secret holds: certificate, key, bundle (PEM).
pub type CaPems = (String, String, String);
/// What the TLS Secret holds: certificate, key (PEM).
pub type LeafPems = (String, String);

pub struct Identity<'a> {
    pub hosts: &'a [String],
    pub cn: &'a str,
    pub leaf_days: i64,
}

fn not_after(pem: &str) -> Option<OffsetDateTime> {
    let der = pem_der(pem).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(cert.validity().not_after.to_datetime())
}

fn key_matches(cert_pem: &str, key_pem: &str) -> bool {
    let (Ok(der), Ok(key)) = (pem_der(cert_pem), KeyPair::from_pem(key_pem)) else {
        return false;
    };
    x509_parser::parse_x509_certificate(&der)
        .map(|(_, c)| c.public_key().subject_public_key.data.as_ref() == key.public_key_raw())
        .unwrap_or(false)
}

/// Splits a PEM bundle into its certificates.
fn split_bundle(bundle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in bundle.lines() {
        current.push_str(line);
        current.push('\n');
        if line.starts_with("-----END CERTIFICATE-----") {
            out.push(std::mem::take(&mut current));
        }
    }
    out
}

/// Decides what to (re)issue from what the Secrets hold now (`None`: absent).
///
/// - The CA is kept while it is valid for longer than a leaf's life plus the renewal margin; otherwise
///   a new CA is made and the old one stays in the bundle until it expires (rollover without a gap).
/// - The leaf is kept when it verifies against the current CA, covers every host and the CN, matches
///   its key and is valid past the renewal margin.
pub fn decide(ca: Option<CaPems>, tls: Option<LeafPems>, id: &Identity<'_>) -> Result<Decision> {
    let mut reasons = Vec::new();
    let now = OffsetDateTime::now_utc();
    let ca_margin = Duration::days(id.leaf_days) + RENEW_BEFORE;
    let ca_want = Want {
        hosts: &[],
        cn: CA_CN,
    };
    let (ca_cert, ca_key, old_bundle, write_ca) = match ca {
        Some((cert, key, bundle))
            if still_valid(&cert, &cert, &ca_want)
                && key_matches(&cert, &key)
                && not_after(&cert).is_some_and(|t| t > now + ca_margin) =>
        {
            (cert, key, bundle, false)
        }
        previous => {
            reasons.push(match &previous {
                None => "no CA yet".to_string(),
                Some(_) => "CA invalid or close to expiry: rolling over".to_string(),
            });
            let (cert, key) = new_ca()?;
            // The previous CA (and whatever it still trusted) stays until it expires.
            let old = previous
                .map(|(c, _, b)| format!("{c}{b}"))
                .unwrap_or_default();
            (cert, key, old, true)
        }
    };
    let mut bundle = ca_cert.clone();
    for cert in split_bundle(&old_bundle) {
        if cert != ca_cert && !bundle.contains(&cert) && not_after(&cert).is_some_and(|t| t > now) {
            bundle.push_str(&cert);
        }
    }
    let write_ca = write_ca || bundle != old_bundle;

    let leaf_want = Want {
        hosts: id.hosts,
        cn: id.cn,
    };
    let (leaf_cert, leaf_key, mut write_tls) = match tls {
        Some((cert, key))
            if still_valid(&cert, &ca_cert, &leaf_want) && key_matches(&cert, &key) =>
        {
            (cert, key, false)
        }
        previous => {
            reasons.push(match previous {
                None => "no serving certificate yet".to_string(),
                Some(_) => {
                    "serving certificate expiring, for other names, or from another CA: reissuing"
                        .to_string()
                }
            });
            let (cert, key) = new_leaf(&ca_cert, &ca_key, id)?;
            (cert, key, true)
        }
    };
    write_tls |= write_ca;
    Ok(Decision {
        material: Material {
            ca_cert,
            ca_key,
            bundle,
            leaf_cert,
            leaf_key,
        },
        write_ca,
        write_tls,
        reasons,
    })
}

const CA_CN: &str = "rekindle-webhook-ca";

fn new_ca() -> Result<(String, String)> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = base_params(CA_CN, CA_DAYS)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn new_leaf(ca_cert: &str, ca_key: &str, id: &Identity<'_>) -> Result<(String, String)> {
    let ca_key = KeyPair::from_pem(ca_key)?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert, &ca_key)?;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = base_params(id.cn, id.leaf_days)?;
    params.subject_alt_names = sans(id.hosts)?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params
        .distinguished_name
        .push(DnType::OrganizationName, "rekindle");
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Which steps `certs-gen cluster` runs (Helm runs them as separate hooks: the Secrets before
/// install, the caBundle after it, when the webhook configuration exists).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    Secrets,
    CaBundle,
    All,
}

pub struct ClusterArgs {
    pub namespace: String,
    pub service: String,
    pub secret: String,
    pub ca_secret: String,
    pub cluster_domain: String,
    pub webhook_config: String,
    pub webhook_name: Vec<String>,
    pub days: i64,
    pub phase: Phase,
    pub dry_run: bool,
}

/// The DNS names a Service is reached by.
pub fn service_hosts(service: &str, namespace: &str, domain: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.{domain}"),
    ]
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let data = secret.data.as_ref()?;
    String::from_utf8(data.get(key)?.0.clone()).ok()
}

fn is_managed(secret: &Secret) -> bool {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1)
}

/// Reads a Secret certs-gen may manage: absent is fine, present without the label is an error.
async fn get_managed(api: &Api<Secret>, name: &str) -> Result<Option<Secret>> {
    match api.get_opt(name).await.with_context(|| format!("reading Secret {name}"))? {
        Some(s) if !is_managed(&s) => bail!(
            "Secret {name} exists but is not labelled {}={}; certs-gen leaves it alone (delete it or pick another name)",
            MANAGED_BY.0,
            MANAGED_BY.1
        ),
        other => Ok(other),
    }
}

fn secret(name: &str, namespace: &str, previous: Option<&Secret>, data: &[(&str, &str)]) -> Secret {
    let mut s = Secret {
        type_: Some("kubernetes.io/tls".into()),
        ..Default::default()
    };
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some(namespace.into());
    s.metadata.labels = Some(BTreeMap::from([(
        MANAGED_BY.0.to_string(),
        MANAGED_BY.1.to_string(),
    )]));
    if let Some(p) = previous {
        s.metadata.resource_version = p.metadata.resource_version.clone();
        // Keep labels and annotations others added.
        let mut labels = p.metadata.labels.clone().unwrap_or_default();
        labels.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
        s.metadata.labels = Some(labels);
        s.metadata.annotations = p.metadata.annotations.clone();
    }
    s.data = Some(
        data.iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect(),
    );
    s
}

/// Creates or replaces (with the read resourceVersion, so a concurrent writer causes a conflict and a
/// fresh decision rather than a lost update).
async fn put(api: &Api<Secret>, previous: Option<&Secret>, s: &Secret) -> Result<(), kube::Error> {
    let name = s.metadata.name.clone().unwrap_or_default();
    match previous {
        None => api.create(&PostParams::default(), s).await.map(|_| ()),
        Some(_) => api
            .replace(&name, &PostParams::default(), s)
            .await
            .map(|_| ()),
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

pub async fn run(client: Client, args: &ClusterArgs) -> Result<()> {
    if args.days < 2 {
        bail!("--days must be at least 2");
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &args.namespace);
    if matches!(args.phase, Phase::Secrets | Phase::All) {
        ensure_secrets(&secrets, args).await?;
    }
    if matches!(args.phase, Phase::CaBundle | Phase::All) {
        ensure_ca_bundle(client, &secrets, args).await?;
    }
    Ok(())
}

async fn ensure_secrets(secrets: &Api<Secret>, args: &ClusterArgs) -> Result<()> {
    let hosts = service_hosts(&args.service, &args.namespace, &args.cluster_domain);
    let cn = format!("{}.{}.svc", args.service, args.namespace);
    let id = Identity {
        hosts: &hosts,
        cn: &cn,
        leaf_days: args.days,
    };
    for _attempt in 0..5 {
        let ca_secret = get_managed(secrets, &args.ca_secret).await?;
        let tls_secret = get_managed(secrets, &args.secret).await?;
        let ca = ca_secret.as_ref().and_then(|s| {
            Some((
                text(s, "tls.crt")?,
                text(s, "tls.key")?,
                text(s, "ca.crt").unwrap_or_default(),
            ))
        });
        let tls = tls_secret
            .as_ref()
            .and_then(|s| Some((text(s, "tls.crt")?, text(s, "tls.key")?)));
        let tls_bundle = tls_secret.as_ref().and_then(|s| text(s, "ca.crt"));
        let d = decide(ca, tls, &id)?;
        let write_tls = d.write_tls || tls_bundle.as_deref() != Some(d.material.bundle.as_str());
        if !d.write_ca && !write_tls {
            eprintln!(
                "certs-gen: Secrets {}/{} and {}/{} are valid; nothing to do",
                args.namespace, args.secret, args.namespace, args.ca_secret
            );
            return Ok(());
        }
        for r in &d.reasons {
            eprintln!("certs-gen: {r}");
        }
        let m = &d.material;
        let ca_obj = secret(
            &args.ca_secret,
            &args.namespace,
            ca_secret.as_ref(),
            &[
                ("tls.crt", &m.ca_cert),
                ("tls.key", &m.ca_key),
                ("ca.crt", &m.bundle),
            ],
        );
        let tls_obj = secret(
            &args.secret,
            &args.namespace,
            tls_secret.as_ref(),
            &[
                ("tls.crt", &m.leaf_cert),
                ("tls.key", &m.leaf_key),
                ("ca.crt", &m.bundle),
            ],
        );
        if args.dry_run {
            if d.write_ca {
                println!(
                    "would write Secret {}/{} (CA)",
                    args.namespace, args.ca_secret
                );
            }
            println!(
                "would write Secret {}/{} (serving certificate for {})",
                args.namespace,
                args.secret,
                hosts.join(", ")
            );
            return Ok(());
        }
        // The CA first: a crash in between leaves a CA without a leaf, which the next run completes.
        if d.write_ca {
            match put(secrets, ca_secret.as_ref(), &ca_obj).await {
                Ok(()) => eprintln!(
                    "certs-gen: wrote Secret {}/{}",
                    args.namespace, args.ca_secret
                ),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e).context(format!("writing Secret {}", args.ca_secret)),
            }
        }
        match put(secrets, tls_secret.as_ref(), &tls_obj).await {
            Ok(()) => {
                eprintln!("certs-gen: wrote Secret {}/{}", args.namespace, args.secret);
                return Ok(());
            }
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(e).context(format!("writing Secret {}", args.secret)),
        }
    }
    bail!("Secrets kept changing under certs-gen (5 conflicts); another writer is racing it")
}

async fn ensure_ca_bundle(client: Client, secrets: &Api<Secret>, args: &ClusterArgs) -> Result<()> {
    use base64::Engine as _;
    let tls = secrets.get_opt(&args.secret).await?.ok_or_else(|| {
        anyhow!(
            "Secret {}/{} does not exist; run the secrets phase first",
            args.namespace,
            args.secret
        )
    })?;
    let bundle = text(&tls, "ca.crt")
        .ok_or_else(|| anyhow!("Secret {}/{} has no ca.crt", args.namespace, args.secret))?;
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let config = api.get_opt(&args.webhook_config).await?.ok_or_else(|| {
        anyhow!(
            "MutatingWebhookConfiguration {} does not exist",
            args.webhook_config
        )
    })?;
    let entries = config.webhooks.unwrap_or_default();
    let mut stale = Vec::new();
    for name in &args.webhook_name {
        let entry = entries.iter().find(|w| &w.name == name).ok_or_else(|| {
            anyhow!(
                "MutatingWebhookConfiguration {} has no webhook named {name}",
                args.webhook_config
            )
        })?;
        let current = entry
            .client_config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.as_slice());
        if current != Some(bundle.as_bytes()) {
            stale.push(name.as_str());
        }
    }
    if stale.is_empty() {
        eprintln!(
            "certs-gen: caBundle of {} is current; nothing to do",
            args.webhook_config
        );
        return Ok(());
    }
    if args.dry_run {
        for name in &stale {
            println!("would set caBundle of {}/{name}", args.webhook_config);
        }
        return Ok(());
    }
    // Server-side apply owning only these fields: Helm (or kubectl) keeps owning the rest.
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&bundle);
    let webhooks: Vec<_> = args
        .webhook_name
        .iter()
        .map(|name| json!({"name": name, "clientConfig": {"caBundle": ca_bundle}}))
        .collect();
    let apply = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": args.webhook_config},
        "webhooks": webhooks,
    });
    api.patch(
        &args.webhook_config,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&apply),
    )
    .await
    .with_context(|| format!("patching the caBundle of {}", args.webhook_config))?;
    eprintln!(
        "certs-gen: set caBundle of {}/{}",
        args.webhook_config,
        stale.join(", ")
    );
    Ok(())
}

/// What `certs-gen cleanup` removes on uninstall (Helm's pre-delete hook): the webhook configuration
/// first (Helm would delete it after the Service it points to), then, in `namespace`, the Secrets
/// certs-gen made and the leader election Lease, which Helm does not own. Absent ones are fine.
pub struct Cleanup<'a> {
    pub webhook_config: &'a str,
    pub namespace: Option<&'a str>,
    /// The server's Deployment: deleted, and its pods waited for, before the Lease goes (a running
    /// leader would create it again, and once Helm has removed its RBAC it cannot delete it itself).
    pub deployment: Option<&'a str>,
    pub secrets: &'a [String],
    pub lease: Option<&'a str>,
}

/// How long the hook waits for the server's pods to stop.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

async fn delete_if_present<K>(api: &Api<K>, what: &str, name: &str, dry_run: bool) -> Result<()>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    if dry_run {
        println!("would delete {what} {name}");
        return Ok(());
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => eprintln!("certs-gen: deleted {what} {name}"),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            eprintln!("certs-gen: {what} {name} is already gone")
        }
        Err(e) => return Err(e).with_context(|| format!("deleting {what} {name}")),
    }
    Ok(())
}

pub async fn cleanup(client: Client, what: &Cleanup<'_>, dry_run: bool) -> Result<()> {
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    delete_if_present(
        &webhooks,
        "MutatingWebhookConfiguration",
        what.webhook_config,
        dry_run,
    )
    .await?;
    let Some(ns) = what.namespace else {
        if !what.secrets.is_empty() || what.lease.is_some() || what.deployment.is_some() {
            bail!("--secret, --lease and --deployment need --namespace");
        }
        return Ok(());
    };
    if let Some(name) = what.deployment {
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(client.clone(), ns);
        if dry_run {
            println!("would delete Deployment {name} and wait for its pods");
        } else {
            // Foreground: the Deployment stays until its ReplicaSets and pods are gone.
            match deployments.delete(name, &DeleteParams::foreground()).await {
                Ok(_) => eprintln!("certs-gen: deleting Deployment {name}"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e).with_context(|| format!("deleting Deployment {name}")),
            }
            let deadline = tokio::time::Instant::now() + STOP_WAIT;
            while deployments.get_opt(name).await?.is_some() {
                if tokio::time::Instant::now() > deadline {
                    bail!("Deployment {name} still has pods after {STOP_WAIT:?}");
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            eprintln!("certs-gen: Deployment {name} and its pods are gone");
        }
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for name in what.secrets {
        delete_if_present(&secrets, "Secret", name, dry_run).await?;
    }
    if let Some(name) = what.lease {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client, ns);
        delete_if_present(&leases, "Lease", name, dry_run).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(hosts: &[String]) -> Identity<'_> {
        Identity {
            hosts,
            cn: "rekindle.ns.svc",
            leaf_days: 365,
        }
    }

    fn as_inputs(m: &Material) -> (Option<CaPems>, Option<LeafPems>) {
        (
            Some((m.ca_cert.clone(), m.ca_key.clone(), m.bundle.clone())),
            Some((m.leaf_cert.clone(), m.leaf_key.clone())),
        )
    }

    #[test]
    fn first_run_issues_then_second_run_keeps_everything() {
        let hosts = service_hosts("rekindle", "ns", "cluster.local");
        let first = decide(None, None, &id(&hosts)).unwrap();
        assert!(first.write_ca && first.write_tls);
        assert_eq!(first.material.bundle, first.material.ca_cert);
        let (ca, tls) = as_inputs(&first.material);
        let second = decide(ca, tls, &id(&hosts)).unwrap();
        assert!(
            !second.write_ca && !second.write_tls,
            "{:?}",
            second.reasons
        );
        assert_eq!(second.material, first.material);
    }

    #[test]
    fn a_new_name_reissues_the_leaf_only() {
        let hosts = service_hosts("rekindle", "ns", "cluster.local");
        let first = decide(None, None, &id(&hosts)).unwrap();
        let (ca, tls) = as_inputs(&first.material);
        let other = service_hosts("rekindle", "ns", "example.org");
        let d = decide(ca, tls, &id(&other)).unwrap();
        assert!(!d.write_ca && d.write_tls);
        assert_eq!(d.material.ca_cert, first.material.ca_cert);
        assert_ne!(d.material.leaf_cert, first.material.leaf_cert);
    }

    #[test]
    fn a_mismatched_key_or_foreign_leaf_is_reissued() {
        let hosts = service_hosts("rekindle", "ns", "cluster.local");
        let a = decide(None, None, &id(&hosts)).unwrap().material;
        let b = decide(None, None, &id(&hosts)).unwrap().material;
        // b's leaf under a's CA.
        let d = decide(
            Some((a.ca_cert.clone(), a.ca_key.clone(), a.bundle.clone())),
            Some((b.leaf_cert.clone(), b.leaf_key.clone())),
            &id(&hosts),
        )
        .unwrap();
        assert!(d.write_tls && !d.write_ca);
        // a's leaf with b's key.
        let d = decide(
            Some((a.ca_cert.clone(), a.ca_key.clone(), a.bundle.clone())),
            Some((a.leaf_cert.clone(), b.leaf_key.clone())),
            &id(&hosts),
        )
        .unwrap();
        assert!(d.write_tls);
    }

    #[test]
    fn an_expiring_ca_rolls_over_keeping_the_old_one_trusted() {
        let hosts = service_hosts("rekindle", "ns", "cluster.local");
        // A CA valid for 100 days only: shorter than a leaf's life plus the margin.
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = base_params(CA_CN, 100).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let old_ca = params.self_signed(&key).unwrap().pem();
        let old = (old_ca.clone(), key.serialize_pem(), old_ca.clone());
        let d = decide(Some(old), None, &id(&hosts)).unwrap();
        assert!(d.write_ca && d.write_tls);
        assert_ne!(d.material.ca_cert, old_ca);
        let certs = split_bundle(&d.material.bundle);
        assert_eq!(certs.len(), 2, "new CA + old CA");
        assert_eq!(certs[0], d.material.ca_cert);
        assert_eq!(certs[1], old_ca);
        // And the next run keeps the two-CA bundle without writing.
        let (ca, tls) = as_inputs(&d.material);
        let again = decide(ca, tls, &id(&hosts)).unwrap();
        assert!(!again.write_ca && !again.write_tls, "{:?}", again.reasons);
        assert_eq!(again.material.bundle, d.material.bundle);
    }

    #[test]
    fn leaf_is_backdated_random_serial_and_one_year() {
        let hosts = service_hosts("rekindle", "ns", "cluster.local");
        let m = decide(None, None, &id(&hosts)).unwrap().material;
        let m2 = decide(None, None, &id(&hosts)).unwrap().material;
        let parse = |pem: &str| {
            let der = pem_der(pem).unwrap();
            let (_, c) = x509_parser::parse_x509_certificate(&der).unwrap();
            (
                c.validity().not_before.to_datetime(),
                c.validity().not_after.to_datetime(),
                c.raw_serial().to_vec(),
            )
        };
        let (nb, na, serial) = parse(&m.leaf_cert);
        let now = OffsetDateTime::now_utc();
        assert!(nb < now - Duration::minutes(50));
        assert!((na - now - Duration::days(365)).abs() < Duration::minutes(5));
        assert_ne!(serial, parse(&m2.leaf_cert).2);
        let (_, ca_na, _) = parse(&m.ca_cert);
        assert!(ca_na > now + Duration::days(3600));
    }
}
