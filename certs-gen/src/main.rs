//! certs-gen: TLS material for rekindle.
//!
//! `local` writes, into a directory, everything a local control plane and a host-run webhook need: a CA,
//! the apiserver's serving certificate, an admin client certificate, a service-account key pair and
//! serving certificates for the webhook. It is idempotent: a file that is still valid is left untouched.
//!
//! `cluster` keeps the webhook's TLS and CA Secrets and the webhook configuration's caBundle in a
//! cluster without cert-manager; `cleanup` removes the webhook configuration (Helm's pre-delete hook).

mod cluster;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use ring::rand::SecureRandom;
use time::{Duration, OffsetDateTime};

#[derive(Parser)]
#[command(
    name = "certs-gen",
    version,
    about = "TLS material for rekindle's webhook and local control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write a CA, apiserver, admin, service-account and webhook certificates into a directory.
    Local {
        /// Output directory (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Hosts or IPs of the webhook's serving certificate (repeatable).
        #[arg(long = "webhook-host", default_values = ["127.0.0.1", "localhost"])]
        webhook_hosts: Vec<String>,
        /// Validity of leaf certificates, in days.
        #[arg(long, default_value_t = 365)]
        days: i64,
    },
    /// Issue a client certificate from the local CA in DIR (for example for a ServiceAccount:
    /// `--cn system:serviceaccount:NS:SA`).
    Client {
        #[arg(long)]
        out: PathBuf,
        /// Base name of the files written (`NAME.crt`, `NAME.key`).
        #[arg(long)]
        name: String,
        #[arg(long)]
        cn: String,
        /// Organization (group); repeatable.
        #[arg(long = "org")]
        orgs: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: i64,
    },
    /// Ensure the webhook's TLS Secret and CA Secret (kubernetes.io/tls, labelled
    /// app.kubernetes.io/managed-by=certs-gen) and the caBundle of the MutatingWebhookConfiguration.
    /// A valid certificate is left alone: no write.
    Cluster {
        /// Namespace of the Service and the Secrets.
        #[arg(long, env = "POD_NAMESPACE")]
        namespace: String,
        /// The webhook's Service; the certificate covers svc, svc.ns, svc.ns.svc, svc.ns.svc.DOMAIN.
        #[arg(long, default_value = "rekindle")]
        service: String,
        /// TLS Secret mounted by the server (tls.crt, tls.key, ca.crt).
        #[arg(long, default_value = "rekindle-tls")]
        secret: String,
        /// Secret holding the CA key (never mounted).
        #[arg(long, default_value = "rekindle-ca")]
        ca_secret: String,
        #[arg(long, default_value = "cluster.local")]
        cluster_domain: String,
        /// MutatingWebhookConfiguration whose caBundle is set.
        #[arg(long, default_value = "rekindle")]
        webhook_config: String,
        /// Webhook entries inside it, each given its caBundle (repeat the flag for several).
        #[arg(long, default_value = "workloads.rekindle.io")]
        webhook_name: Vec<String>,
        /// Validity of the serving certificate, in days (renewed 30 days before expiry).
        #[arg(long, default_value_t = 365)]
        days: i64,
        /// `secrets` (before install), `ca-bundle` (after install) or `all`.
        #[arg(long, value_enum, default_value = "all")]
        phase: cluster::Phase,
        /// Say what would be written, write nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
    },
    /// Delete the MutatingWebhookConfiguration, then the given Secrets and Lease (absent is fine).
    Cleanup {
        #[arg(long, default_value = "rekindle")]
        webhook_config: String,
        /// Namespace of the Secrets and the Lease.
        #[arg(long)]
        namespace: Option<String>,
        /// The server's Deployment, stopped before the Lease is deleted.
        #[arg(long)]
        deployment: Option<String>,
        /// A Secret certs-gen made (repeatable).
        #[arg(long = "secret")]
        secrets: Vec<String>,
        /// The leader election Lease.
        #[arg(long)]
        lease: Option<String>,
        #[arg(long)]
        dry_run: bool,
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
    },
}

/// In-cluster config, or the kubeconfig file given.
async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no in-cluster config and no kubeconfig")?,
    };
    Ok(kube::Client::try_from(config)?)
}

fn block_on<F: std::future::Future<Output = Result<()>>>(f: F) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

/// Renew anything that expires within this margin.
const RENEW_BEFORE: Duration = Duration::days(30);

fn random_serial() -> Result<SerialNumber> {
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("no system randomness"))?;
    bytes[0] &= 0x7f; // positive
    Ok(SerialNumber::from_slice(&bytes))
}

fn base_params(cn: &str, days: i64) -> Result<CertificateParams> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(days);
    params.serial_number = Some(random_serial()?);
    Ok(params)
}

fn sans(hosts: &[String]) -> Result<Vec<SanType>> {
    hosts
        .iter()
        .map(|h| match h.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(
                h.clone()
                    .try_into()
                    .with_context(|| format!("invalid DNS name {h}"))?,
            )),
        })
        .collect()
}

fn write(path: &Path, contents: &str, private: bool) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

struct Ca {
    cert_pem: String,
    key: KeyPair,
}

/// What an existing leaf must still satisfy to be kept.
struct Want<'a> {
    hosts: &'a [String],
    cn: &'a str,
}

fn pem_der(pem: &str) -> Result<Vec<u8>> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("bad PEM: {e}"))?;
    Ok(p.contents)
}

/// True when `cert_pem` is signed by the CA, valid past the renewal margin, and has the wanted CN and SANs.
fn still_valid(cert_pem: &str, ca_pem: &str, want: &Want<'_>) -> bool {
    let check = || -> Result<bool> {
        let der = pem_der(cert_pem)?;
        let ca_der = pem_der(ca_pem)?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der)?;
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der)?;
        if cert.verify_signature(Some(ca.public_key())).is_err() {
            return Ok(false);
        }
        let deadline = OffsetDateTime::now_utc() + RENEW_BEFORE;
        if cert.validity().not_after.to_datetime() < deadline {
            return Ok(false);
        }
        let cn_ok = cert
            .subject()
            .iter_common_name()
            .any(|c| c.as_str().ok() == Some(want.cn));
        let mut have: Vec<String> = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    x509_parser::extensions::GeneralName::DNSName(d) => have.push(d.to_string()),
                    x509_parser::extensions::GeneralName::IPAddress(b) => {
                        let ip = match b.len() {
                            4 => IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default()),
                            16 => IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default()),
                            _ => continue,
                        };
                        have.push(ip.to_string());
                    }
                    _ => {}
                }
            }
        }
        Ok(cn_ok && want.hosts.iter().all(|h| have.contains(h)))
    };
    check().unwrap_or(false)
}

fn ensure_ca(dir: &Path) -> Result<(Ca, bool)> {
    let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    if let (Ok(cert_pem), Ok(key_pem)) =
        (std::fs::read_to_string(&crt), std::fs::read_to_string(&key))
    {
        let want = Want {
            hosts: &[],
            cn: "rekindle-local-ca",
        };
        if still_valid(&cert_pem, &cert_pem, &want) {
            return Ok((
                Ca {
                    cert_pem,
                    key: KeyPair::from_pem(&key_pem)?,
                },
                false,
            ));
        }
    }
    let key_pair = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = base_params("rekindle-local-ca", 3650)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key_pair)?;
    write(&key, &key_pair.serialize_pem(), true)?;
    write(&crt, &cert.pem(), false)?;
    eprintln!("certs-gen: wrote {}", crt.display());
    Ok((
        Ca {
            cert_pem: cert.pem(),
            key: key_pair,
        },
        true,
    ))
}

/// A certificate signed by the CA: `<name>.crt` and `<name>.key`.
struct Leaf<'a> {
    name: &'a str,
    cn: &'a str,
    orgs: &'a [String],
    hosts: &'a [String],
    /// A server's certificate (TLS server auth), or a client's.
    server: bool,
    days: i64,
}

/// Writes `leaf` unless a valid one for the same names is there (or `force`, after a new CA).
fn ensure_leaf(dir: &Path, ca: &Ca, force: bool, leaf: &Leaf<'_>) -> Result<()> {
    let Leaf {
        name,
        cn,
        orgs,
        hosts,
        server,
        days,
    } = *leaf;
    let (crt, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    if !force && key.exists() {
        if let Ok(pem) = std::fs::read_to_string(&crt) {
            if still_valid(&pem, &ca.cert_pem, &Want { hosts, cn }) {
                return Ok(());
            }
        }
    }
    let key_pair = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = base_params(cn, days)?;
    for o in orgs {
        params
            .distinguished_name
            .push(DnType::OrganizationName, o.as_str());
    }
    params.subject_alt_names = sans(hosts)?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![if server {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, &ca.key)?;
    let cert = params.signed_by(&key_pair, &issuer)?;
    write(&key, &key_pair.serialize_pem(), true)?;
    write(&crt, &cert.pem(), false)?;
    eprintln!("certs-gen: wrote {}", crt.display());
    Ok(())
}

fn ensure_sa_keys(dir: &Path, force: bool) -> Result<()> {
    let (key, public) = (dir.join("sa.key"), dir.join("sa.pub"));
    if !force
        && key.exists()
        && public.exists()
        && KeyPair::from_pem(&std::fs::read_to_string(&key)?).is_ok()
    {
        return Ok(());
    }
    let key_pair = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    write(&key, &key_pair.serialize_pem(), true)?;
    write(&public, &key_pair.public_key_pem(), false)?;
    eprintln!("certs-gen: wrote {}", key.display());
    Ok(())
}

fn local(out: &Path, webhook_hosts: &[String], days: i64) -> Result<()> {
    if days < 2 {
        bail!("--days must be at least 2");
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let (ca, new_ca) = ensure_ca(out)?;
    let apiserver_hosts: Vec<String> = [
        "127.0.0.1",
        "10.0.0.1",
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
    ]
    .map(String::from)
    .to_vec();
    let leaves = [
        Leaf {
            name: "apiserver",
            cn: "kube-apiserver",
            orgs: &[],
            hosts: &apiserver_hosts,
            server: true,
            days,
        },
        Leaf {
            name: "admin",
            cn: "e2e-admin",
            orgs: &["system:masters".into()],
            hosts: &[],
            server: false,
            days,
        },
        Leaf {
            name: "webhook",
            cn: "rekindle-webhook",
            orgs: &[],
            hosts: webhook_hosts,
            server: true,
            days,
        },
    ];
    for leaf in &leaves {
        ensure_leaf(out, &ca, new_ca, leaf)?;
    }
    ensure_sa_keys(out, new_ca)
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("certs-gen: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(command: Cmd) -> Result<()> {
    match command {
        Cmd::Local {
            out,
            webhook_hosts,
            days,
        } => local(&out, &webhook_hosts, days),
        Cmd::Client {
            out,
            name,
            cn,
            orgs,
            days,
        } => {
            let ca = Ca {
                cert_pem: std::fs::read_to_string(out.join("ca.crt"))
                    .context("reading ca.crt (run `certs-gen local` first)")?,
                key: KeyPair::from_pem(
                    &std::fs::read_to_string(out.join("ca.key")).context("reading ca.key")?,
                )?,
            };
            let leaf = Leaf {
                name: &name,
                cn: &cn,
                orgs: &orgs,
                hosts: &[],
                server: false,
                days,
            };
            ensure_leaf(&out, &ca, false, &leaf)
        }
        Cmd::Cluster {
            namespace,
            service,
            secret,
            ca_secret,
            cluster_domain,
            webhook_config,
            webhook_name,
            days,
            phase,
            dry_run,
            kubeconfig,
        } => block_on(async move {
            let client = kube_client(kubeconfig.as_deref()).await?;
            cluster::run(
                client,
                &cluster::ClusterArgs {
                    namespace,
                    service,
                    secret,
                    ca_secret,
                    cluster_domain,
                    webhook_config,
                    webhook_name,
                    days,
                    phase,
                    dry_run,
                },
            )
            .await
        }),
        Cmd::Cleanup {
            webhook_config,
            namespace,
            deployment,
            secrets,
            lease,
            dry_run,
            kubeconfig,
        } => block_on(async move {
            let client = kube_client(kubeconfig.as_deref()).await?;
            let what = cluster::Cleanup {
                webhook_config: &webhook_config,
                namespace: namespace.as_deref(),
                deployment: deployment.as_deref(),
                secrets: &secrets,
                lease: lease.as_deref(),
            };
            cluster::cleanup(client, &what, dry_run).await
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_is_idempotent_and_reissues_on_san_change() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = vec!["127.0.0.1".to_string()];
        local(dir.path(), &hosts, 365).unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
        let (ca, webhook, admin) = (read("ca.crt"), read("webhook.crt"), read("admin.crt"));
        assert!(still_valid(
            &webhook,
            &ca,
            &Want {
                hosts: &hosts,
                cn: "rekindle-webhook"
            }
        ));
        local(dir.path(), &hosts, 365).unwrap();
        assert_eq!(read("ca.crt"), ca);
        assert_eq!(
            read("webhook.crt"),
            webhook,
            "a valid certificate must be left untouched"
        );
        // A new SAN reissues the webhook leaf only.
        let more = vec!["127.0.0.1".to_string(), "::1".to_string()];
        local(dir.path(), &more, 365).unwrap();
        assert_ne!(read("webhook.crt"), webhook);
        assert_eq!(read("admin.crt"), admin);
        assert!(still_valid(
            &read("webhook.crt"),
            &ca,
            &Want {
                hosts: &more,
                cn: "rekindle-webhook"
            }
        ));
    }

    #[test]
    fn short_lived_or_foreign_certs_are_not_valid() {
        let dir = tempfile::tempdir().unwrap();
        local(dir.path(), &["127.0.0.1".into()], 10).unwrap();
        let ca = std::fs::read_to_string(dir.path().join("ca.crt")).unwrap();
        let leaf = std::fs::read_to_string(dir.path().join("webhook.crt")).unwrap();
        // Expires within the 30-day margin.
        assert!(!still_valid(
            &leaf,
            &ca,
            &Want {
                hosts: &[],
                cn: "rekindle-webhook"
            }
        ));
        let other = tempfile::tempdir().unwrap();
        local(other.path(), &["127.0.0.1".into()], 365).unwrap();
        let other_ca = std::fs::read_to_string(other.path().join("ca.crt")).unwrap();
        let other_leaf = std::fs::read_to_string(other.path().join("webhook.crt")).unwrap();
        assert!(!still_valid(
            &other_leaf,
            &ca,
            &Want {
                hosts: &[],
                cn: "rekindle-webhook"
            }
        ));
        assert!(still_valid(
            &other_leaf,
            &other_ca,
            &Want {
                hosts: &[],
                cn: "rekindle-webhook"
            }
        ));
    }
}
